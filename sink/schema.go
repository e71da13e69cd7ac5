package sink

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
)

// Bookkeeping columns of a history table, after the source columns.
var bookkeeping = []string{"scd_id", "valid_from", "valid_to", "is_current", "scd_seq", "scd_close_seq", "scd_op", "scd_hash", "scd_unavailable"}

// Bookkeeping columns of the side table <target>_scd_events.
type colInfo struct {
	name     string
	oid      uint32
	typeName string // format_type() without modifier, usable in array casts
	fullType string // format_type() with modifier, for DDL
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
	colIdx  map[string]int
	keyIdx  []int // in spec.Keys order
	trkIdx  []int
	t1Idx   []int
	ignore  map[string]bool
	// hasInfinity: a timestamp or date column may read back as infinity.
	hasInfinity bool
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
	return name == "scd_t"
}

// ensureServiceTables creates the offsets, truncates and dead-letter tables.
func ensureServiceTables(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	s := pgx.Identifier{cfg.Schema}.Sanitize()
	stmts := []string{
		"CREATE SCHEMA IF NOT EXISTS " + s,
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.scd2sink_offsets (
			consumer_group text NOT NULL, topic text NOT NULL, partition integer NOT NULL,
			next_offset bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (consumer_group, topic, partition))`, s),
		// The highest sequence below next_offset: where a snapshot read
		// without a sequence is anchored after a restart.
		fmt.Sprintf(`ALTER TABLE %s.scd2sink_offsets ADD COLUMN IF NOT EXISTS anchor_seq bytea`, s),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.scd2sink_truncates (
			target text NOT NULL, scd_seq bytea NOT NULL, valid_from timestamptz NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (target, scd_seq))`, s),
		// Completed full snapshots of tables with snapshot_deletes: close,
		// until their reconciliation is done (reconcile.go).
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.scd2sink_snapshots (
			consumer_group text NOT NULL, target text NOT NULL, scd_seq bytea NOT NULL,
			valid_from timestamptz NOT NULL, topic text NOT NULL, until jsonb NOT NULL,
			recorded_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz,
			PRIMARY KEY (consumer_group, target, scd_seq))`, s),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text, partition integer,
			"offset" bigint, target text, key bytea, value bytea, error text NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now())`, s, pgx.Identifier{cfg.DeadLetterTable}.Sanitize()),
	}
	return inDDLTx(ctx, pool, "scd2sink service tables", stmts)
}

func inDDLTx(ctx context.Context, pool *pgxpool.Pool, lock string, stmts []string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", lock); err != nil {
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

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i > 0 {
		return s[:i]
	}
	return s
}

// asOfFunction renders the DDL of <target>_as_of(at timestamptz): the
// versions valid at at (DESIGN.md section 4). Its result type is the
// history table's row type, so it follows added columns; a table renamed
// or dropped (rebuild) needs it dropped first (AsOfFunctionDDL).
func asOfFunction(schema, target, create string) string {
	hist := pgx.Identifier{schema, target}.Sanitize()
	return fmt.Sprintf(`%s FUNCTION %s(at timestamptz) RETURNS SETOF %s LANGUAGE sql STABLE AS
		$scd2sink$ SELECT * FROM %s WHERE valid_from <= at AND (valid_to IS NULL OR at < valid_to) $scd2sink$`,
		create, pgx.Identifier{schema, target + "_as_of"}.Sanitize(), hist, hist)
}

// DropAsOfFunction renders the DDL that drops a target's as-of function
// (before its history table is dropped or renamed away).
func DropAsOfFunction(schema, target string) string {
	return fmt.Sprintf("DROP FUNCTION IF EXISTS %s(timestamptz)", pgx.Identifier{schema, target + "_as_of"}.Sanitize())
}

// CreateAsOfFunction renders the DDL that creates a target's as-of
// function anew (after a rebuild swapped its history table in).
func CreateAsOfFunction(schema, target string) string {
	return asOfFunction(schema, target, "CREATE")
}

// ensureTable creates the history table, its side table and view if missing
// (source columns first: spec.Columns, then extra, in order), adds the
// columns of extra that an existing table lacks, and reads the table's
// columns back.
func ensureTable(ctx context.Context, pool *pgxpool.Pool, spec TableSpec, extra []change.Column) (*table, error) {
	t := &table{
		spec:    spec,
		hist:    pgx.Identifier{spec.Schema, spec.Target},
		side:    pgx.Identifier{spec.Schema, spec.Target + "_scd_events"},
		repairs: pgx.Identifier{spec.Schema, spec.Target + "_scd_repairs"},
		view:    pgx.Identifier{spec.Schema, spec.Target + "_current"},
		ignore:  map[string]bool{},
	}
	for _, c := range spec.IgnoreColumns {
		t.ignore[c] = true
	}
	var all []change.Column
	seen := map[string]bool{}
	for _, c := range spec.Columns {
		all = append(all, change.Column{Name: c.Name, PGType: c.Type})
	}
	all = append(all, extra...)
	var defs []string
	for _, c := range all {
		if !t.ignore[c.Name] && !seen[c.Name] {
			seen[c.Name] = true
			defs = append(defs, pgx.Identifier{c.Name}.Sanitize()+" "+keyType(c.PGType))
		}
	}
	keyIdents := quoteIdents(spec.Keys)
	for _, k := range spec.Keys {
		if !seen[k] {
			seen[k] = true
			defs = append([]string{pgx.Identifier{k}.Sanitize() + " text"}, defs...)
		}
	}
	hist, side := t.hist.Sanitize(), t.side.Sanitize()
	cols := strings.Join(defs, ",\n")
	stmts := []string{
		"CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{spec.Schema}.Sanitize(),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (%s,
			scd_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			valid_from timestamptz NOT NULL, valid_to timestamptz, is_current boolean NOT NULL,
			scd_seq bytea NOT NULL, scd_close_seq bytea, scd_op text NOT NULL, scd_hash bytea NOT NULL,
			scd_unavailable text[]
		) WITH (fillfactor = 70)`, hist, cols),
		// A pre-created table may hold only the source columns.
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS scd_id bigint GENERATED ALWAYS AS IDENTITY,
			ADD COLUMN IF NOT EXISTS valid_from timestamptz, ADD COLUMN IF NOT EXISTS valid_to timestamptz,
			ADD COLUMN IF NOT EXISTS is_current boolean, ADD COLUMN IF NOT EXISTS scd_seq bytea,
			ADD COLUMN IF NOT EXISTS scd_close_seq bytea,
			ADD COLUMN IF NOT EXISTS scd_op text NOT NULL DEFAULT 'u',
			ADD COLUMN IF NOT EXISTS scd_hash bytea NOT NULL DEFAULT ''::bytea,
			ADD COLUMN IF NOT EXISTS scd_unavailable text[]`, hist),
		fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (%s, scd_seq)`,
			pgx.Identifier{spec.Target + "_scd_key_seq"}.Sanitize(), hist, keyIdents),
		// A pre-created table may lack the primary key on scd_id.
		fmt.Sprintf(`DO $$ BEGIN
			IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = '%[1]s'::regclass AND indisunique
				AND indkey::int2[] = ARRAY[(SELECT attnum FROM pg_attribute WHERE attrelid = '%[1]s'::regclass AND attname = 'scd_id')]::int2[]) THEN
				CREATE UNIQUE INDEX ON %[2]s (scd_id);
			END IF; END $$`, strings.ReplaceAll(hist, "'", "''"), hist),
	}
	for _, c := range extra {
		if t.ignore[c.Name] {
			continue
		}
		def := pgx.Identifier{c.Name}.Sanitize() + " " + keyType(c.PGType)
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s", hist, def))
	}
	stmts = append(stmts, fmt.Sprintf("CREATE OR REPLACE VIEW %s AS SELECT * FROM %s WHERE is_current", t.view.Sanitize(), hist),
		asOfFunction(spec.Schema, spec.Target, "CREATE OR REPLACE"))
	if err := inDDLTx(ctx, pool, "scd2sink table "+hist, stmts); err != nil {
		return nil, fmt.Errorf("creating history table %s: %w", hist, err)
	}
	if err := t.load(ctx, pool); err != nil {
		return nil, err
	}
	if vs := t.viewStatements(); len(vs) > 0 {
		if err := inDDLTx(ctx, pool, "scd2sink views of "+hist, vs); err != nil {
			return nil, fmt.Errorf("creating the views of %s: %w", hist, err)
		}
	}
	// The side table mirrors the history table's source columns and types.
	stmts = []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
			scd_seq bytea NOT NULL, scd_op text NOT NULL, scd_t timestamptz NOT NULL, scd_hash bytea NOT NULL, scd_unavailable text[])`, side)}
	for _, c := range t.cols {
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s %s", side, pgx.Identifier{c.name}.Sanitize(), c.fullType))
	}
	stmts = append(stmts, fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (%s, scd_seq)`,
		pgx.Identifier{spec.Target + "_scd_events_key_seq"}.Sanitize(), side, keyIdents),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			repaired_at timestamptz NOT NULL DEFAULT now(), key jsonb NOT NULL, cause_seq bytea,
			before jsonb NOT NULL, after jsonb)`, t.repairs.Sanitize()))
	if err := inDDLTx(ctx, pool, "scd2sink table "+hist, stmts); err != nil {
		return nil, fmt.Errorf("creating side table %s: %w", side, err)
	}
	return t, nil
}

func keyType(inferred string) string {
	if inferred == "" {
		return "text"
	}
	return inferred
}

// load reads the table's source columns and classifies them.
func (t *table) load(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT a.attname, a.atttypid, format_type(a.atttypid, NULL), format_type(a.atttypid, a.atttypmod)
		FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, t.hist.Sanitize())
	if err != nil {
		return fmt.Errorf("reading columns of %s: %w", t.hist.Sanitize(), err)
	}
	var cols []colInfo
	for rows.Next() {
		var c colInfo
		if err := rows.Scan(&c.name, &c.oid, &c.typeName, &c.fullType); err != nil {
			return err
		}
		if c.name == "scd_seq" && c.typeName != "bytea" {
			rows.Close()
			return fmt.Errorf("history table %s has scd_seq of type %s; scd2sink keeps sequences as bytea", t.hist.Sanitize(), c.typeName)
		}
		if !isBookkeeping(c.name) {
			cols = append(cols, c)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading columns of %s: %w", t.hist.Sanitize(), err)
	}
	tracked := map[string]bool{}
	for _, c := range t.spec.TrackHistory {
		tracked[pgIdent(c)] = true
	}
	t.cols, t.colIdx = cols, map[string]int{}
	t.hasInfinity = false
	for _, c := range cols {
		switch c.oid {
		case pgtype.TimestamptzOID, pgtype.TimestampOID, pgtype.DateOID:
			t.hasInfinity = true
		}
	}
	t.keyIdx, t.trkIdx, t.t1Idx = nil, nil, nil
	for i := range t.cols {
		c := &t.cols[i]
		t.colIdx[c.name] = i
		for _, k := range t.spec.Keys {
			c.key = c.key || pgIdent(k) == c.name
		}
		switch {
		case c.key:
		case len(tracked) == 0 || tracked[c.name]:
			c.tracked = true
			t.trkIdx = append(t.trkIdx, i)
		default:
			t.t1Idx = append(t.t1Idx, i)
		}
	}
	for _, k := range t.spec.Keys {
		i, ok := t.colIdx[pgIdent(k)]
		if !ok {
			return fmt.Errorf("history table %s has no key column %q", t.hist.Sanitize(), k)
		}
		t.keyIdx = append(t.keyIdx, i)
	}
	return nil
}
