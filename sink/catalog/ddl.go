package catalog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
)

// DDL etiquette (DESIGN.md section 6): the catalog is read first and DDL
// runs only for what must change, so that a restart with nothing to change
// takes no lock stronger than its DML needs. ALTER TABLE, CREATE OR
// REPLACE VIEW and the like take ACCESS EXCLUSIVE locks; one waiting
// behind an analyst's open read would queue every later reader behind it.
// What DDL does run waits at most lock_timeout (set on every connection)
// and is retried with backoff.

// Catalog is what exists of a target's objects in its schema.
type Catalog struct {
	Schema bool
	Rels   map[string]byte     // relation name -> relkind
	Notes  map[string]string   // relation name -> its comment
	Cols   map[string][]string // relation name -> columns in order
	Types  map[string][]string // relation name -> format_type of cols, in order
	AsOf   bool
	// asOfSrc is the as-of function's body.
	asOfSrc string
	// SCDIDUnique: the history table has a unique index on scd_id alone
	// (on scd_id first, for a partitioned table: with its partition keys).
	SCDIDUnique bool
}

// Has reports whether the relation name exists.
func (c *Catalog) Has(name string) bool { _, ok := c.Rels[name]; return ok }

// HasCol reports whether the relation rel has the column col.
func (c *Catalog) HasCol(rel, col string) bool { return slices.Contains(c.Cols[rel], col) }

// ColType is format_type of rel's column col ("" if it has none).
func (c *Catalog) ColType(rel, col string) string {
	if i := slices.Index(c.Cols[rel], col); i >= 0 && i < len(c.Types[rel]) {
		return c.Types[rel][i]
	}
	return ""
}

// Querier is a pool or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadCatalog reads which of names exist in schema, with their columns
// and comments; asOf names a function to look for ("" for none) and hist
// the table whose scd_id index is checked ("" for none).
func ReadCatalog(ctx context.Context, q Querier, schema string, names []string, asOf, hist string) (*Catalog, error) {
	c := &Catalog{Rels: map[string]byte{}, Notes: map[string]string{}, Cols: map[string][]string{}, Types: map[string][]string{}}
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&c.Schema); err != nil {
		return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
	}
	if !c.Schema {
		return c, nil
	}
	var fit []string
	for _, n := range names {
		if len(n) <= 63 { // a longer name cannot exist (and is an error as a name)
			fit = append(fit, n)
		}
	}
	names = fit
	rows, err := q.Query(ctx, `SELECT c.relname, c.relkind::text, coalesce(obj_description(c.oid, 'pg_class'), ''),
			coalesce((SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a
				WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
			coalesce((SELECT array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum) FROM pg_attribute a
				WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = ANY ($2)`, schema, names)
	if err != nil {
		return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
	}
	for rows.Next() {
		var name, kind, note string
		var cols, types []string
		if err := rows.Scan(&name, &kind, &note, &cols, &types); err != nil {
			rows.Close()
			return nil, err
		}
		c.Rels[name], c.Notes[name], c.Cols[name], c.Types[name] = kind[0], note, cols, types
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
	}
	if asOf != "" {
		if err := q.QueryRow(ctx, `SELECT count(*) > 0, coalesce(max(p.prosrc), '') FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = $1 AND p.proname = $2 AND p.proargtypes = '1184'::oidvector`, schema, asOf).Scan(&c.AsOf, &c.asOfSrc); err != nil {
			return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
		}
	}
	if hist != "" && c.Has(hist) {
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
			JOIN pg_namespace n ON n.oid = t.relnamespace JOIN pg_attribute a ON a.attrelid = t.oid AND a.attname = 'scd_id'
			WHERE n.nspname = $1 AND t.relname = $2 AND i.indisunique AND i.indkey[0] = a.attnum AND (i.indnatts = 1 OR t.relkind = 'p'))`,
			schema, hist).Scan(&c.SCDIDUnique); err != nil {
			return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
		}
	}
	return c, nil
}

// CreateSchema renders CREATE SCHEMA for a schema that does not exist.
func CreateSchema(schema string) string {
	return "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{schema}.Sanitize()
}

// ObjectNames are the names of the objects the sink derives from a target
// (DESIGN.md section 4).
// Every suffix is at most 12 bytes, so a target of up to 51 bytes
// (config.MaxTargetBytes) never has a name truncated. The side table's
// index was called <target>_scd_events_key_seq before targets that long
// were allowed; such an index is still found under that name.
type ObjectNames struct {
	Hist, Side, Repairs, Current, AsOf, KeyIndex, SideIndex, OldSideIndex, IDIndex string
	// Dir and DirKey are a partitioned table's key directory and its
	// primary key.
	Dir, DirKey string
	// Exclusion is the no-overlap constraint and its index (overlap.go).
	Exclusion string
	// Consistent is the view of the versions as of the instant every
	// target is complete through (consistent.go).
	Consistent string
}

// Index name suffixes (see objectNames).
const (
	KeyIndexSuffix     = "_scd_key_seq"
	SideIndexSuffix    = "_scd_evt_seq"
	OldSideIndexSuffix = "_scd_events_key_seq"
	IDIndexSuffix      = "_scd_id_key"
)

// NamesOf returns the names of the objects the sink derives from target.
func NamesOf(target string) ObjectNames {
	return ObjectNames{Hist: target, Side: target + "_scd_events", Repairs: target + "_scd_repairs",
		Current: target + "_current", AsOf: target + "_as_of",
		KeyIndex: target + KeyIndexSuffix, SideIndex: target + SideIndexSuffix, OldSideIndex: target + OldSideIndexSuffix,
		IDIndex: target + IDIndexSuffix, Dir: target + DirSuffix, DirKey: target + DirKeySuffix, Exclusion: target + ExclusionSuffix,
		Consistent: target + "_consistent"}
}

// viewTag is the comment the sink puts on a view it created: a digest of
// its definition, so that an unchanged view is never replaced.
func viewTag(sql string) string {
	sum := sha256.Sum256([]byte(sql))
	return "scd2sink " + hex.EncodeToString(sum[:12])
}

// Ensure brings the history table, its side table, repair audit,
// current view, as-of function and configured views to what spec and the
// extra columns need (source columns first: spec.Columns, then extra, in
// order), running DDL only for what is missing or different, and reads
// the table's columns back.
func Ensure(ctx context.Context, pool *pgxpool.Pool, spec TableSpec, extra []change.Column) (*Table, error) {
	t, err := ensure(ctx, pool, spec, extra)
	if err != nil && schemaCollided(err) {
		// Another session created the schema meanwhile (CREATE SCHEMA IF
		// NOT EXISTS side by side collide): a new transaction finds it
		// there. Once: it has been created by then.
		return ensure(ctx, pool, spec, extra)
	}
	return t, err
}

func ensure(ctx context.Context, pool *pgxpool.Pool, spec TableSpec, extra []change.Column) (*Table, error) {
	n := NamesOf(spec.Target)
	t := &Table{
		Spec:    spec,
		Hist:    pgx.Identifier{spec.Schema, n.Hist},
		Side:    pgx.Identifier{spec.Schema, n.Side},
		Repairs: pgx.Identifier{spec.Schema, n.Repairs},
		View:    pgx.Identifier{spec.Schema, n.Current},
		Ignore:  map[string]bool{},
	}
	for _, c := range spec.IgnoreColumns {
		t.Ignore[c] = true
	}
	lookFor := []string{n.Hist, n.Side, n.Repairs, n.Current, n.KeyIndex, n.SideIndex, n.Consistent}
	if len(n.OldSideIndex) <= 63 {
		lookFor = append(lookFor, n.OldSideIndex)
	}
	for _, v := range spec.Views {
		lookFor = append(lookFor, v.Name)
	}
	cat, err := ReadCatalog(ctx, pool, spec.Schema, lookFor, n.AsOf, n.Hist)
	if err != nil {
		return nil, err
	}
	var all []change.Column
	for _, c := range spec.Columns {
		all = append(all, change.Column{Name: c.Name, PGType: c.Type})
	}
	all = append(all, extra...)
	hist, side := t.Hist.Sanitize(), t.Side.Sanitize()
	keyIdents := QuoteIdents(spec.Keys)
	upgradeAttnum := "smallint" // scd_attnum's type as added to an older table
	var stmts []string
	if !cat.Schema {
		stmts = append(stmts, CreateSchema(spec.Schema))
	}
	histCols := slices.Clone(cat.Cols[n.Hist])
	// scd_deleted marks the versions a delete opened (deletes: new_record);
	// a table gets it when it first needs it (a constant default: no
	// rewrite) and keeps it.
	newRecord, deletedDef := spec.Deletes == fold.DeletesNewRecord, ""
	if newRecord {
		deletedDef = ",\n\t\t\tscd_deleted boolean NOT NULL DEFAULT false"
	}
	if !cat.Has(n.Hist) {
		seen := map[string]bool{}
		var defs []string
		for _, c := range all {
			if !t.Ignore[c.Name] && !seen[c.Name] {
				seen[c.Name] = true
				defs = append(defs, pgx.Identifier{c.Name}.Sanitize()+" "+keyType(c.PGType))
				histCols = append(histCols, c.Name)
			}
		}
		for _, k := range spec.Keys {
			if !seen[k] {
				seen[k] = true
				defs = append([]string{pgx.Identifier{k}.Sanitize() + " text"}, defs...)
				histCols = append([]string{k}, histCols...)
			}
		}
		pk := " PRIMARY KEY"
		if spec.Partitioning.Interval != "" {
			pk = ""
		}
		columns := fmt.Sprintf(`%s,
			scd_id bigint GENERATED ALWAYS AS IDENTITY%s,
			valid_from timestamptz NOT NULL, valid_to timestamptz, is_current boolean NOT NULL,
			scd_seq bytea NOT NULL, scd_close_seq bytea, scd_op text NOT NULL, scd_hash bytea NOT NULL,
			scd_unavailable text[], scd_absent text[], scd_raw_t timestamptz, scd_attnum smallint%s`, strings.Join(defs, ",\n"), pk, deletedDef)
		histCols = append(histCols, Bookkeeping...)
		if newRecord {
			histCols = append(histCols, "scd_deleted")
		}
		if spec.Partitioning.Interval != "" {
			var version int
			if err := pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
				return nil, fmt.Errorf("reading the server's version: %w", err)
			}
			if version < 150000 {
				return nil, fmt.Errorf("creating history table %s partitioned: partitioning needs PostgreSQL 15 or later (NULLS NOT DISTINCT), the server is %d", hist, version)
			}
			// A key directory left from a table dropped by hand
			// describes nothing any more (its key may differ too).
			stmts = append(stmts, fmt.Sprintf(`DROP TABLE IF EXISTS %s`, pgx.Identifier{spec.Schema, n.Hist + DirSuffix}.Sanitize()))
			stmts = append(stmts, partitionedDDL(spec.Schema, n.Hist, columns, n.KeyIndex, n.IDIndex, keyIdents)...)
		} else {
			stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (%s
		) WITH (fillfactor = 70)`, hist, columns),
				fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (%s, scd_seq)`,
					pgx.Identifier{n.KeyIndex}.Sanitize(), hist, keyIdents))
		}
	} else {
		// A pre-created table may hold only the source columns; a table
		// of an older scd2sink lacks the newer bookkeeping columns. Its
		// rows get scd_attnum as the table is now (a fast default, no
		// rewrite): a column added from here on is one they do not know.
		var adds []string
		if !slices.Contains(histCols, "scd_attnum") {
			var known int
			if err := pool.QueryRow(ctx, `SELECT coalesce(max(attnum), 0) FROM pg_attribute
				WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attname::text <> ALL($2::text[])`, hist, Bookkeeping).Scan(&known); err != nil {
				return nil, fmt.Errorf("reading the columns of %s: %w", hist, err)
			}
			upgradeAttnum = fmt.Sprintf("smallint DEFAULT %d", known)
		}
		for _, b := range []struct{ name, def string }{
			{"scd_id", "bigint GENERATED ALWAYS AS IDENTITY"}, {"valid_from", "timestamptz"}, {"valid_to", "timestamptz"},
			{"is_current", "boolean"}, {"scd_seq", "bytea"}, {"scd_close_seq", "bytea"},
			{"scd_op", "text NOT NULL DEFAULT 'u'"}, {"scd_hash", "bytea NOT NULL DEFAULT ''::bytea"}, {"scd_unavailable", "text[]"},
			{"scd_absent", "text[]"}, {"scd_raw_t", "timestamptz"}, {"scd_attnum", upgradeAttnum},
			{"scd_deleted", "boolean NOT NULL DEFAULT false"},
		} {
			if b.name == "scd_deleted" && !newRecord {
				continue
			}
			if !slices.Contains(histCols, b.name) {
				adds = append(adds, "ADD COLUMN IF NOT EXISTS "+b.name+" "+b.def)
				histCols = append(histCols, b.name)
			}
		}
		for _, c := range all {
			if !t.Ignore[c.Name] && !slices.Contains(histCols, c.Name) {
				adds = append(adds, "ADD COLUMN IF NOT EXISTS "+pgx.Identifier{c.Name}.Sanitize()+" "+keyType(c.PGType))
				histCols = append(histCols, c.Name)
			}
		}
		if len(adds) > 0 {
			stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s %s", hist, strings.Join(adds, ", ")))
		}
		if upgradeAttnum != "smallint" {
			stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ALTER COLUMN scd_attnum DROP DEFAULT", hist))
		}
		if !cat.Has(n.KeyIndex) {
			stmts = append(stmts, fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (%s, scd_seq)`,
				pgx.Identifier{n.KeyIndex}.Sanitize(), hist, keyIdents))
		}
		if !cat.SCDIDUnique {
			// A pre-created table may lack the primary key on scd_id.
			// Named, so that two instances adopting it at once make one.
			stmts = append(stmts, fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (scd_id)`,
				pgx.Identifier{n.IDIndex}.Sanitize(), hist))
		}
	}
	if !slices.Equal(cat.Cols[n.Current], histCols) {
		stmts = append(stmts, currentView("CREATE OR REPLACE", t.View, t.Hist, slices.Contains(histCols, "scd_deleted")))
	}
	if !slices.Equal(cat.Cols[n.Consistent], histCols) {
		t.DeletedCol = slices.Contains(histCols, "scd_deleted") // as load will read it
		stmts = append(stmts, t.consistentView("CREATE OR REPLACE"))
	}
	if deleted := slices.Contains(histCols, "scd_deleted"); !cat.AsOf || deleted != strings.Contains(cat.asOfSrc, "scd_deleted") {
		stmts = append(stmts, asOfFunction(spec.Schema, spec.Target, "CREATE OR REPLACE", deleted))
	}
	if len(stmts) > 0 {
		if err := InDDLTx(ctx, pool, "scd2sink table "+hist, stmts); err != nil {
			return nil, fmt.Errorf("creating history table %s: %w", hist, err)
		}
	}
	if err := t.load(ctx, pool); err != nil {
		return nil, err
	}
	if err := t.loadPartitions(ctx, pool, cat.Has(n.Hist)); err != nil {
		return nil, err
	}
	if spec.NoOverlap {
		if err := ensureNoOverlap(ctx, pool, t); err != nil {
			return nil, err
		}
	}
	views, err := t.ViewStatements(ctx, pool)
	if err != nil {
		return nil, err
	}
	var vs []string
	for i, v := range views {
		name := spec.Views[i].Name
		if tag := viewTag(v); cat.Notes[name] != tag {
			vs = append(vs, v, fmt.Sprintf("COMMENT ON VIEW %s IS %s", pgx.Identifier{spec.Schema, name}.Sanitize(), QuoteLiteral(tag)))
		}
	}
	if len(vs) > 0 {
		if err := InDDLTx(ctx, pool, "scd2sink views of "+hist, vs); err != nil {
			return nil, fmt.Errorf("creating the views of %s: %w", hist, err)
		}
	}
	// The side table mirrors the history table's source columns and types.
	stmts = nil
	if !cat.Has(n.Side) {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
			scd_seq bytea NOT NULL, scd_op text NOT NULL, scd_t timestamptz NOT NULL, scd_hash bytea NOT NULL, scd_unavailable text[], scd_absent text[], scd_raw_t timestamptz, scd_attnum smallint)`, side))
	}
	var adds []string
	sideDefault := false
	for _, c := range []string{"scd_absent text[]", "scd_raw_t timestamptz", "scd_attnum " + upgradeAttnum} { // side tables of older versions
		if name, _, _ := strings.Cut(c, " "); cat.Has(n.Side) && !cat.HasCol(n.Side, name) {
			adds = append(adds, "ADD COLUMN IF NOT EXISTS "+c)
			sideDefault = sideDefault || (name == "scd_attnum" && upgradeAttnum != "smallint")
		}
	}
	for _, c := range t.Cols {
		switch typ := cat.ColType(n.Side, c.Name); {
		case !cat.HasCol(n.Side, c.Name):
			adds = append(adds, fmt.Sprintf("ADD COLUMN IF NOT EXISTS %s %s", pgx.Identifier{c.Name}.Sanitize(), c.FullType))
		case typ != c.FullType:
			// The history column's type changed (an operator widened it
			// to take values that were dead-lettered, or the service did):
			// the side table follows, so that a replay fits there too.
			id := pgx.Identifier{c.Name}.Sanitize()
			adds = append(adds, fmt.Sprintf("ALTER COLUMN %s TYPE %s USING %s::%s", id, c.FullType, id, c.FullType))
		}
	}
	if len(adds) > 0 {
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s %s", side, strings.Join(adds, ", ")))
	}
	if sideDefault {
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ALTER COLUMN scd_attnum DROP DEFAULT", side))
	}
	if !cat.Has(n.SideIndex) && !cat.Has(n.OldSideIndex) {
		stmts = append(stmts, fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (%s, scd_seq)`,
			pgx.Identifier{n.SideIndex}.Sanitize(), side, keyIdents))
	}
	if !cat.Has(n.Repairs) {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			repaired_at timestamptz NOT NULL DEFAULT now(), key jsonb NOT NULL, cause_seq bytea,
			before jsonb NOT NULL, after jsonb, omitted integer NOT NULL DEFAULT 0)`, t.Repairs.Sanitize()))
	} else if !cat.HasCol(n.Repairs, "omitted") {
		stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS omitted integer NOT NULL DEFAULT 0`, t.Repairs.Sanitize()))
	}
	if len(stmts) > 0 {
		if err := InDDLTx(ctx, pool, "scd2sink table "+hist, stmts); err != nil {
			return nil, fmt.Errorf("creating side table %s: %w", side, err)
		}
	}
	return t, nil
}

// schemaCollided reports whether err is CREATE SCHEMA IF NOT EXISTS
// failing because another session created the schema at the same time
// (the catalog's unique index on schema names).
func schemaCollided(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "pg_namespace_nspname_index"
}
