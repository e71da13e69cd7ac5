package sink

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/sink/fold"
)

// Bookkeeping columns of a history table, after the source columns.
var bookkeeping = []string{"scd_id", "valid_from", "valid_to", "is_current", "scd_seq", "scd_close_seq", "scd_op", "scd_hash", "scd_unavailable", "scd_absent", "scd_raw_t", "scd_attnum"}

// Bookkeeping columns of the side table <target>_scd_events.
type colInfo struct {
	name     string
	oid      uint32
	typeName string // format_type() without modifier, usable in array casts
	fullType string // format_type() with modifier, for DDL
	attnum   int16  // its position in the history table (pg_attribute.attnum)
	key      bool
	tracked  bool
}

// table is a history table as it exists in the database.
type table struct {
	spec TableSpec
	hist pgx.Identifier
	side pgx.Identifier
	// repairs is <target>_scd_repairs, the audit of late repairs.
	repairs pgx.Identifier
	view    pgx.Identifier
	cols    []colInfo
	// Shape is what the fold reads: the columns' names and positions,
	// tracked and Type 1 (rebuilt by load).
	fold.Shape
	keyIdx []int // in spec.Keys order
	// number is this description's own, for the state cache's keys: a
	// table read anew is a new description, whose keys the cache has not
	// seen.
	number uint64
	ignore map[string]bool
	// hasInfinity: a timestamp or date column may read back as infinity.
	hasInfinity bool
	// attnum is the highest attnum of the source columns: every row
	// written records it (scd_attnum), so that a column added later is
	// known to be absent from the rows written before (DESIGN.md section
	// 11), not NULL in them.
	attnum int16
	// deletedCol: the table has scd_deleted (it has had deletes:
	// new_record), written true for the versions a delete opened.
	deletedCol bool
	// parts are the partitions of a partitioned history table the sink
	// created (partition.go); nil for a plain table.
	parts *partitions
	// plainButPartitioned: the config asks for partitioning, the table
	// existed unpartitioned (left as it is; rebuild migrates it).
	plainButPartitioned bool
}

func quoteIdents(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(q, ", ")
}

func (t *table) colNames() []string {
	out := make([]string, len(t.cols))
	for i, c := range t.cols {
		out[i] = c.name
	}
	return out
}

func (t *table) keyNames() []string { return t.spec.Keys }

func isBookkeeping(name string) bool {
	for _, b := range bookkeeping {
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

func inDDLTx(ctx context.Context, pool *pgxpool.Pool, lock string, stmts []string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// DDL waits at most lock_timeout for its lock, but once it has it,
		// adopting a large pre-created table (a rewrite, an index build)
		// may take longer than statement_timeout: let it finish.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1)), set_config('statement_timeout', '0', true)", lock); err != nil {
			return err
		}
		for _, st := range stmts {
			if _, err := tx.Exec(ctx, st); err != nil {
				return fmt.Errorf("%s: %w", firstLine(st), err)
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

func firstLine(s string) string {
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
func (t *table) load(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT a.attname, a.atttypid, format_type(a.atttypid, NULL), format_type(a.atttypid, a.atttypmod), a.attnum
		FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, t.hist.Sanitize())
	if err != nil {
		return fmt.Errorf("reading columns of %s: %w", t.hist.Sanitize(), err)
	}
	var cols []colInfo
	deleted := false
	for rows.Next() {
		var c colInfo
		if err := rows.Scan(&c.name, &c.oid, &c.typeName, &c.fullType, &c.attnum); err != nil {
			return err
		}
		if c.name == "scd_seq" && c.typeName != "bytea" {
			rows.Close()
			return &DriftError{Table: t.hist.Sanitize(), What: fmt.Sprintf("scd_seq is of type %s; scd2sink keeps sequences as bytea", c.typeName)}
		}
		if !isBookkeeping(c.name) {
			cols = append(cols, c)
		}
		deleted = deleted || c.name == "scd_deleted"
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading columns of %s: %w", t.hist.Sanitize(), err)
	}
	tracked := map[string]bool{}
	for _, c := range t.spec.TrackHistory {
		tracked[pgIdent(c)] = true
	}
	t.cols, t.deletedCol = cols, deleted
	t.Shape = fold.Shape{Index: map[string]int{}, Deletes: t.spec.Deletes, Type1Scope: t.spec.Type1Scope}
	t.attnum = 0
	for _, c := range cols {
		t.attnum = max(t.attnum, c.attnum)
	}
	t.hasInfinity = false
	for _, c := range cols {
		switch c.oid {
		case pgtype.TimestamptzOID, pgtype.TimestampOID, pgtype.DateOID:
			t.hasInfinity = true
		}
	}
	t.keyIdx = nil
	for i := range t.cols {
		c := &t.cols[i]
		t.Index[c.name] = i
		t.Names = append(t.Names, c.name)
		for _, k := range t.spec.Keys {
			c.key = c.key || pgIdent(k) == c.name
		}
		switch {
		case c.key:
		case len(tracked) == 0 || tracked[c.name]:
			c.tracked = true
			t.Tracked = append(t.Tracked, i)
		default:
			t.Type1 = append(t.Type1, i)
		}
	}
	for _, k := range t.spec.Keys {
		i, ok := t.Index[pgIdent(k)]
		if !ok {
			return &DriftError{Table: t.hist.Sanitize(), What: fmt.Sprintf("has no key column %q (dropped by hand?)", k)}
		}
		t.keyIdx = append(t.keyIdx, i)
	}
	return nil
}

// hasAll reports whether t (nil: no table yet) has a column for every name
// of an image but those ignored.
func (t *table) hasAll(image map[string]any, ignored []string) bool {
	if t == nil {
		return false
	}
	for name := range image {
		if !t.has(name, ignored) {
			return false
		}
	}
	return true
}

// has reports whether the table has the image's column name, or ignores it.
func (t *table) has(name string, ignored []string) bool {
	_, ok := t.Index[pgIdent(name)]
	return ok || contains(ignored, name)
}
