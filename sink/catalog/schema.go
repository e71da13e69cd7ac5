package catalog

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/sink/fold"
)

// Bookkeeping columns of a history table, after the source columns.
var Bookkeeping = []string{"scd_id", "valid_from", "valid_to", "is_current", "scd_seq", "scd_close_seq", "scd_op", "scd_hash", "scd_unavailable", "scd_absent", "scd_raw_t", "scd_attnum"}

// ColumnInfo is a source column of a history table as the catalog has it.
type ColumnInfo struct {
	Name     string
	OID      uint32
	TypeName string // format_type() without modifier, as the schema checks compare types
	FullType string // format_type() with modifier, for DDL
	// CastName is the type as a cast names it (Cast): format_type() with
	// the modifier -1, which, unlike TypeName, does not read as a length
	// of one (character is char(1), bpchar any length).
	CastName string
	Attnum   int16 // its position in the history table (pg_attribute.attnum)
	Key      bool
	Tracked  bool
}

// Table is a history table as it exists in the database: its names,
// columns and partitions, and what the fold needs of it (Shape).
type Table struct {
	Spec TableSpec
	Hist pgx.Identifier
	Side pgx.Identifier
	// Repairs is <target>_scd_repairs, the audit of late repairs.
	Repairs pgx.Identifier
	View    pgx.Identifier
	Cols    []ColumnInfo
	// Shape is what the fold reads: the columns' names and positions,
	// tracked and Type 1 (rebuilt by load).
	fold.Shape
	KeyIdx []int // in spec.Keys order
	Ignore map[string]bool
	// HasInfinity: a timestamp or date column may read back as infinity.
	HasInfinity bool
	// Attnum is the highest attnum of the source columns: every row
	// written records it (scd_attnum), so that a column added later is
	// known to be absent from the rows written before (DESIGN.md section
	// 11), not NULL in them.
	Attnum int16
	// DeletedCol: the table has scd_deleted (it has had deletes:
	// new_record), written true for the versions a delete opened.
	DeletedCol bool
	// Parts are the partitions of a partitioned history table the sink
	// created (partition.go); nil for a plain table.
	Parts *Partitions
	// PlainButPartitioned: the config asks for partitioning, the table
	// existed unpartitioned (left as it is; rebuild migrates it).
	PlainButPartitioned bool
}

// Cast is the type values are cast to for this column: CastName, or
// TypeName when the catalog did not give one.
func (c *ColumnInfo) Cast() string {
	if c.CastName != "" {
		return c.CastName
	}
	return c.TypeName
}

// QuoteIdents quotes names as identifiers, joined by commas.
func QuoteIdents(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// ColNames are the source columns' names, in row order.
func (t *Table) ColNames() []string {
	out := make([]string, len(t.Cols))
	for i, c := range t.Cols {
		out[i] = c.Name
	}
	return out
}

// KeyNames are the business key columns, in the spec's order.
func (t *Table) KeyNames() []string { return t.Spec.Keys }

// IsBookkeeping reports whether name is one of the sink's own columns of
// a history table (Bookkeeping, scd_t and scd_deleted), not a source column.
func IsBookkeeping(name string) bool {
	for _, b := range Bookkeeping {
		if b == name {
			return true
		}
	}
	return name == "scd_t" || name == "scd_deleted"
}

// currentView renders the DDL of <target>_current: the current versions,
// without those marked deleted (deletes: new_record) where the table has
// scd_deleted.
func currentView(create string, view, hist pgx.Identifier, deleted bool) string {
	where := "is_current"
	if deleted {
		where += " AND NOT scd_deleted"
	}
	return fmt.Sprintf("%s VIEW %s AS SELECT * FROM %s WHERE %s", create, view.Sanitize(), hist.Sanitize(), where)
}

// InDDLTx runs stmts in one transaction under the advisory lock named
// lock, each waiting at most lock_timeout for its table lock and without
// a statement_timeout.
func InDDLTx(ctx context.Context, pool *pgxpool.Pool, lock string, stmts []string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// DDL waits at most lock_timeout for its lock, but once it has it,
		// adopting a large pre-created table (a rewrite, an index build)
		// may take longer than statement_timeout: let it finish.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1)), set_config('statement_timeout', '0', true)", lock); err != nil {
			return err
		}
		for _, st := range stmts {
			if _, err := tx.Exec(ctx, st); err != nil {
				return fmt.Errorf("%s: %w", FirstLine(st), err)
			}
		}
		return nil
	})
}

// dollarQuote quotes body as a dollar-quoted string constant whose tag
// body does not contain (a target's name may hold anything, $$ included).
func dollarQuote(body string) string {
	tag := "$scd2sink$"
	for i := 0; strings.Contains(body, tag); i++ {
		tag = fmt.Sprintf("$scd2sink%d$", i)
	}
	return tag + body + tag
}

// FirstLine is the first line of s (a statement, for an error).
func FirstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i > 0 {
		return s[:i]
	}
	return s
}

// asOfFunction renders the DDL of <target>_as_of(at timestamptz): the
// versions valid at at (DESIGN.md section 4), without those marked
// deleted where the table has scd_deleted (deleted): the rows as they were
// at at, so that _as_of(now()) is _current. Its result type is the
// history table's row type, so it follows added columns; a table renamed
// or dropped (rebuild) needs it dropped first (AsOfFunctionDDL).
func asOfFunction(schema, target, create string, deleted bool) string {
	hist := pgx.Identifier{schema, target}.Sanitize()
	cond := ""
	if deleted {
		cond = "AND NOT scd_deleted "
	}
	body := fmt.Sprintf(" SELECT * FROM %s WHERE valid_from <= at AND (valid_to IS NULL OR at < valid_to) %s", hist, cond)
	return fmt.Sprintf(`%s FUNCTION %s(at timestamptz) RETURNS SETOF %s LANGUAGE sql STABLE AS %s`,
		create, pgx.Identifier{schema, target + "_as_of"}.Sanitize(), hist, dollarQuote(body))
}

// DropAsOfFunction renders the DDL that drops a target's as-of function
// (before its history table is dropped or renamed away).
func DropAsOfFunction(schema, target string) string {
	return fmt.Sprintf("DROP FUNCTION IF EXISTS %s(timestamptz)", pgx.Identifier{schema, target + "_as_of"}.Sanitize())
}

// CreateAsOfFunction renders the DDL that creates a target's as-of
// function anew (after a rebuild swapped its history table in); deleted:
// the table has scd_deleted (deletes: new_record).
func CreateAsOfFunction(schema, target string, deleted bool) string {
	return asOfFunction(schema, target, "CREATE", deleted)
}

func keyType(inferred string) string {
	if inferred == "" {
		return "text"
	}
	return inferred
}

// load reads the table's source columns and classifies them.
func (t *Table) load(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT a.attname, a.atttypid, format_type(a.atttypid, NULL), format_type(a.atttypid, a.atttypmod), format_type(a.atttypid, -1), a.attnum
		FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, t.Hist.Sanitize())
	if err != nil {
		return fmt.Errorf("reading columns of %s: %w", t.Hist.Sanitize(), err)
	}
	var cols []ColumnInfo
	deleted := false
	for rows.Next() {
		var c ColumnInfo
		if err := rows.Scan(&c.Name, &c.OID, &c.TypeName, &c.FullType, &c.CastName, &c.Attnum); err != nil {
			return err
		}
		if c.Name == "scd_seq" && c.TypeName != "bytea" {
			rows.Close()
			return &DriftError{Table: t.Hist.Sanitize(), What: fmt.Sprintf("scd_seq is of type %s; scd2sink keeps sequences as bytea", c.TypeName)}
		}
		if !IsBookkeeping(c.Name) {
			cols = append(cols, c)
		}
		deleted = deleted || c.Name == "scd_deleted"
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading columns of %s: %w", t.Hist.Sanitize(), err)
	}
	tracked := map[string]bool{}
	for _, c := range t.Spec.TrackHistory {
		tracked[Ident(c)] = true
	}
	t.Cols, t.DeletedCol = cols, deleted
	t.Shape = fold.Shape{Index: map[string]int{}, Deletes: t.Spec.Deletes, Type1Scope: t.Spec.Type1Scope}
	t.Attnum = 0
	for _, c := range cols {
		t.Attnum = max(t.Attnum, c.Attnum)
	}
	t.HasInfinity = false
	for _, c := range cols {
		switch c.OID {
		case pgtype.TimestamptzOID, pgtype.TimestampOID, pgtype.DateOID:
			t.HasInfinity = true
		}
	}
	t.KeyIdx = nil
	for i := range t.Cols {
		c := &t.Cols[i]
		t.Index[c.Name] = i
		t.Names = append(t.Names, c.Name)
		for _, k := range t.Spec.Keys {
			c.Key = c.Key || Ident(k) == c.Name
		}
		switch {
		case c.Key:
		case len(tracked) == 0 || tracked[c.Name]:
			c.Tracked = true
			t.Tracked = append(t.Tracked, i)
		default:
			t.Type1 = append(t.Type1, i)
		}
	}
	for _, k := range t.Spec.Keys {
		i, ok := t.Index[Ident(k)]
		if !ok {
			return &DriftError{Table: t.Hist.Sanitize(), What: fmt.Sprintf("has no key column %q (dropped by hand?)", k)}
		}
		t.KeyIdx = append(t.KeyIdx, i)
	}
	return nil
}

// HasAll reports whether t (nil: no table yet) has a column for every name
// of an image but those ignored.
func (t *Table) HasAll(image map[string]any, ignored []string) bool {
	if t == nil {
		return false
	}
	for name := range image {
		if !t.Has(name, ignored) {
			return false
		}
	}
	return true
}

// Has reports whether the table has the image's column name, or ignores it.
func (t *Table) Has(name string, ignored []string) bool {
	_, ok := t.Index[Ident(name)]
	return ok || slices.Contains(ignored, name)
}

// KeyTypes are the types of t's key columns, in key order, as casts name them.
func (t *Table) KeyTypes() []string {
	out := make([]string, len(t.KeyIdx))
	for i, ki := range t.KeyIdx {
		out[i] = t.Cols[ki].Cast()
	}
	return out
}

// KeyJoin renders "a.k1 = b.k1 AND ..." over t's key columns.
func (t *Table) KeyJoin(a, b string) string {
	var parts []string
	for _, k := range t.KeyNames() {
		q := pgx.Identifier{k}.Sanitize()
		parts = append(parts, fmt.Sprintf("%s.%s = %s.%s", a, q, b, q))
	}
	return strings.Join(parts, " AND ")
}

// KeyColumns reads the key columns of the history table schema.target
// from its (key columns, scd_seq) index (a partitioned table's: key
// columns, scd_seq, is_current, valid_to), in order; none when it does
// not exist.
func KeyColumns(ctx context.Context, q Querier, schema, target string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT a.attname FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE n.nspname = $1 AND c.relname = $2
		ORDER BY array_position(i.indkey::int2[], a.attnum)`, schema, target+KeyIndexSuffix)
	if err != nil {
		return nil, fmt.Errorf("reading the key of %s: %w", target, err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading the key of %s: %w", target, err)
	}
	// A partitioned table's index goes on with its partition keys.
	if i := slices.Index(cols, "scd_seq"); i >= 0 {
		cols = cols[:i]
	}
	return cols, nil
}
