package sink

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"go.uber.org/zap"
)

// DDL etiquette (DESIGN.md section 6): the catalog is read first and DDL
// runs only for what must change, so that a restart with nothing to change
// takes no lock stronger than its DML needs. ALTER TABLE, CREATE OR
// REPLACE VIEW and the like take ACCESS EXCLUSIVE locks; one waiting
// behind an analyst's open read would queue every later reader behind it.
// What DDL does run waits at most lock_timeout (set on every connection)
// and is retried with backoff.

// catalog is what exists of a target's objects in its schema.
type catalog struct {
	schema bool
	rels   map[string]byte     // relation name -> relkind
	notes  map[string]string   // relation name -> its comment
	cols   map[string][]string // relation name -> columns in order
	types  map[string][]string // relation name -> format_type of cols, in order
	asOf   bool
	// asOfSrc is the as-of function's body.
	asOfSrc string
	// scdIDUnique: the history table has a unique index on scd_id alone
	// (on scd_id first, for a partitioned table: with its partition keys).
	scdIDUnique bool
}

func (c *catalog) has(name string) bool { _, ok := c.rels[name]; return ok }

func (c *catalog) hasCol(rel, col string) bool { return slices.Contains(c.cols[rel], col) }

// colType is format_type of rel's column col ("" if it has none).
func (c *catalog) colType(rel, col string) string {
	if i := slices.Index(c.cols[rel], col); i >= 0 && i < len(c.types[rel]) {
		return c.types[rel][i]
	}
	return ""
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// readCatalog reads which of names exist in schema, with their columns
// and comments; asOf names a function to look for ("" for none) and hist
// the table whose scd_id index is checked ("" for none).
func readCatalog(ctx context.Context, q querier, schema string, names []string, asOf, hist string) (*catalog, error) {
	c := &catalog{rels: map[string]byte{}, notes: map[string]string{}, cols: map[string][]string{}, types: map[string][]string{}}
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&c.schema); err != nil {
		return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
	}
	if !c.schema {
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
		c.rels[name], c.notes[name], c.cols[name], c.types[name] = kind[0], note, cols, types
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
	}
	if asOf != "" {
		if err := q.QueryRow(ctx, `SELECT count(*) > 0, coalesce(max(p.prosrc), '') FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = $1 AND p.proname = $2 AND p.proargtypes = '1184'::oidvector`, schema, asOf).Scan(&c.asOf, &c.asOfSrc); err != nil {
			return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
		}
	}
	if hist != "" && c.has(hist) {
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
			JOIN pg_namespace n ON n.oid = t.relnamespace JOIN pg_attribute a ON a.attrelid = t.oid AND a.attname = 'scd_id'
			WHERE n.nspname = $1 AND t.relname = $2 AND i.indisunique AND i.indkey[0] = a.attnum AND (i.indnatts = 1 OR t.relkind = 'p'))`,
			schema, hist).Scan(&c.scdIDUnique); err != nil {
			return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
		}
	}
	return c, nil
}

// createSchema renders CREATE SCHEMA for a schema that does not exist.
func createSchema(schema string) string {
	return "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{schema}.Sanitize()
}

// ensureServiceTables creates what is missing of the offsets, truncates,
// snapshots and dead-letter tables.
func ensureServiceTables(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	s := pgx.Identifier{cfg.Schema}.Sanitize()
	cat, err := readCatalog(ctx, pool, cfg.Schema,
		[]string{"scd2sink_offsets", "scd2sink_truncates", "scd2sink_snapshots", cfg.DeadLetterTable, watermarkView, progressTable, claimsTable, outsideWritesTable, topicsTable, lateTable, erasuresTable}, "", "")
	if err != nil {
		return err
	}
	var stmts []string
	if !cat.schema {
		stmts = append(stmts, createSchema(cfg.Schema))
	}
	if !cat.has(topicsTable) {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (consumer_group text NOT NULL, topic text NOT NULL,
			partitions integer NOT NULL, resized_at timestamptz, PRIMARY KEY (consumer_group, topic))`, s, topicsTable))
	}
	if !cat.has("scd2sink_offsets") {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.scd2sink_offsets (
			consumer_group text NOT NULL, topic text NOT NULL, partition integer NOT NULL,
			next_offset bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(),
			anchor_seq bytea, topic_id text, target text, last_valid_from timestamptz,
			PRIMARY KEY (consumer_group, topic, partition))`, s))
	} else {
		// What the completeness watermark is built from (watermark.go).
		for _, col := range []string{"target text", "last_valid_from timestamptz"} {
			if name, _, _ := strings.Cut(col, " "); !cat.hasCol("scd2sink_offsets", name) {
				stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.scd2sink_offsets ADD COLUMN IF NOT EXISTS %s`, s, col))
			}
		}
		if !cat.hasCol("scd2sink_offsets", "anchor_seq") {
			// The highest sequence below next_offset: where a snapshot read
			// without a sequence is anchored after a restart.
			stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.scd2sink_offsets ADD COLUMN IF NOT EXISTS anchor_seq bytea`, s))
		}
		if !cat.hasCol("scd2sink_offsets", "topic_id") {
			// The Kafka topic ID the offsets belong to: a topic deleted and
			// re-created under the same name has another.
			stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.scd2sink_offsets ADD COLUMN IF NOT EXISTS topic_id text`, s))
		}
	}
	if !cat.has("scd2sink_truncates") {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.scd2sink_truncates (
			target text NOT NULL, scd_seq bytea NOT NULL, valid_from timestamptz NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (target, scd_seq))`, s))
	}
	if !cat.has("scd2sink_snapshots") {
		// Completed full snapshots of tables with snapshot_deletes: close,
		// until their reconciliation is done (reconcile.go).
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.scd2sink_snapshots (
			consumer_group text NOT NULL, target text NOT NULL, scd_seq bytea NOT NULL,
			valid_from timestamptz NOT NULL, topic text NOT NULL, until jsonb NOT NULL,
			recorded_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz,
			held_at timestamptz, held_keys bigint, live_keys bigint, confirmed_at timestamptz,
			PRIMARY KEY (consumer_group, target, scd_seq))`, s))
	} else if !cat.hasCol("scd2sink_snapshots", "confirmed_at") {
		// The reconciliation guard (reconcile.go): a held one, what it
		// would close, and its confirmation.
		stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.scd2sink_snapshots ADD COLUMN IF NOT EXISTS held_at timestamptz,
			ADD COLUMN IF NOT EXISTS held_keys bigint, ADD COLUMN IF NOT EXISTS live_keys bigint,
			ADD COLUMN IF NOT EXISTS confirmed_at timestamptz`, s))
	}
	if !cat.has(lateTable) {
		// Reconciled snapshots that late events reached (reconcile.go):
		// appended to, never updated, so a batch never waits on a
		// reconciliation's rows.
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (
			consumer_group text NOT NULL, target text NOT NULL, scd_seq bytea NOT NULL,
			noted_at timestamptz NOT NULL DEFAULT now())`, s, lateTable),
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s.%s (consumer_group, target, scd_seq)`, lateTable+"_idx", s, lateTable))
	}
	if !cat.has(cfg.DeadLetterTable) {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text, partition integer,
			"offset" bigint, target text, key bytea, value bytea, error text NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now(), headers jsonb, replayed_at timestamptz, decoded boolean)`, s, pgx.Identifier{cfg.DeadLetterTable}.Sanitize()))
	} else if !cat.hasCol(cfg.DeadLetterTable, "headers") {
		// The record's headers: without Apicurio's schema id header a
		// dead letter's bare Avro could never be decoded again.
		stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.%s ADD COLUMN IF NOT EXISTS headers jsonb`, s, pgx.Identifier{cfg.DeadLetterTable}.Sanitize()))
	}
	stmts = append(stmts, watermarkDDL(cat, cfg)...)
	stmts = append(stmts, claimsDDL(cat, cfg)...)
	stmts = append(stmts, replayDDL(cat, cfg)...)
	stmts = append(stmts, erasureDDL(cat, cfg)...)
	if len(stmts) == 0 {
		return nil
	}
	cfg.Logger.Info("creating the service's tables", zap.String("schema", cfg.Schema), zap.Int("statements", len(stmts)))
	return inDDLTx(ctx, pool, "scd2sink service tables", stmts)
}

// objectNames are the names of the objects the sink derives from a target
// (DESIGN.md section 4).
// Every suffix is at most 12 bytes, so a target of up to 51 bytes
// (config.MaxTargetBytes) never has a name truncated. The side table's
// index was called <target>_scd_events_key_seq before targets that long
// were allowed; such an index is still found under that name.
type objectNames struct {
	hist, side, repairs, current, asOf, keyIndex, sideIndex, oldSideIndex, idIndex string
}

// Index name suffixes (see objectNames).
const (
	KeyIndexSuffix     = "_scd_key_seq"
	SideIndexSuffix    = "_scd_evt_seq"
	OldSideIndexSuffix = "_scd_events_key_seq"
	IDIndexSuffix      = "_scd_id_key"
)

func namesOf(target string) objectNames {
	return objectNames{hist: target, side: target + "_scd_events", repairs: target + "_scd_repairs",
		current: target + "_current", asOf: target + "_as_of",
		keyIndex: target + KeyIndexSuffix, sideIndex: target + SideIndexSuffix, oldSideIndex: target + OldSideIndexSuffix,
		idIndex: target + IDIndexSuffix}
}

// viewTag is the comment the sink puts on a view it created: a digest of
// its definition, so that an unchanged view is never replaced.
func viewTag(sql string) string {
	sum := sha256.Sum256([]byte(sql))
	return "scd2sink " + hex.EncodeToString(sum[:12])
}

// ensureTable brings the history table, its side table, repair audit,
// current view, as-of function and configured views to what spec and the
// extra columns need (source columns first: spec.Columns, then extra, in
// order), running DDL only for what is missing or different, and reads
// the table's columns back.
func ensureTable(ctx context.Context, pool *pgxpool.Pool, spec TableSpec, extra []change.Column) (*table, error) {
	n := namesOf(spec.Target)
	t := &table{
		number:  tableNumbers.Add(1),
		spec:    spec,
		hist:    pgx.Identifier{spec.Schema, n.hist},
		side:    pgx.Identifier{spec.Schema, n.side},
		repairs: pgx.Identifier{spec.Schema, n.repairs},
		view:    pgx.Identifier{spec.Schema, n.current},
		ignore:  map[string]bool{},
	}
	for _, c := range spec.IgnoreColumns {
		t.ignore[c] = true
	}
	lookFor := []string{n.hist, n.side, n.repairs, n.current, n.keyIndex, n.sideIndex}
	if len(n.oldSideIndex) <= 63 {
		lookFor = append(lookFor, n.oldSideIndex)
	}
	for _, v := range spec.Views {
		lookFor = append(lookFor, v.Name)
	}
	cat, err := readCatalog(ctx, pool, spec.Schema, lookFor, n.asOf, n.hist)
	if err != nil {
		return nil, err
	}
	var all []change.Column
	for _, c := range spec.Columns {
		all = append(all, change.Column{Name: c.Name, PGType: c.Type})
	}
	all = append(all, extra...)
	hist, side := t.hist.Sanitize(), t.side.Sanitize()
	keyIdents := quoteIdents(spec.Keys)
	upgradeAttnum := "smallint" // scd_attnum's type as added to an older table
	var stmts []string
	if !cat.schema {
		stmts = append(stmts, createSchema(spec.Schema))
	}
	histCols := slices.Clone(cat.cols[n.hist])
	// scd_deleted marks the versions a delete opened (deletes: new_record);
	// a table gets it when it first needs it (a constant default: no
	// rewrite) and keeps it.
	newRecord, deletedDef := spec.Deletes == DeletesNewRecord, ""
	if newRecord {
		deletedDef = ",\n\t\t\tscd_deleted boolean NOT NULL DEFAULT false"
	}
	if !cat.has(n.hist) {
		seen := map[string]bool{}
		var defs []string
		for _, c := range all {
			if !t.ignore[c.Name] && !seen[c.Name] {
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
		histCols = append(histCols, bookkeeping...)
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
			stmts = append(stmts, partitionedDDL(spec.Schema, n.hist, columns, n.keyIndex, n.idIndex, keyIdents)...)
		} else {
			stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (%s
		) WITH (fillfactor = 70)`, hist, columns),
				fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (%s, scd_seq)`,
					pgx.Identifier{n.keyIndex}.Sanitize(), hist, keyIdents))
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
				WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attname::text <> ALL($2::text[])`, hist, bookkeeping).Scan(&known); err != nil {
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
			if !t.ignore[c.Name] && !slices.Contains(histCols, c.Name) {
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
		if !cat.has(n.keyIndex) {
			stmts = append(stmts, fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (%s, scd_seq)`,
				pgx.Identifier{n.keyIndex}.Sanitize(), hist, keyIdents))
		}
		if !cat.scdIDUnique {
			// A pre-created table may lack the primary key on scd_id.
			// Named, so that two instances adopting it at once make one.
			stmts = append(stmts, fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (scd_id)`,
				pgx.Identifier{n.idIndex}.Sanitize(), hist))
		}
	}
	if !slices.Equal(cat.cols[n.current], histCols) {
		stmts = append(stmts, currentView("CREATE OR REPLACE", t.view, t.hist, slices.Contains(histCols, "scd_deleted")))
	}
	if deleted := slices.Contains(histCols, "scd_deleted"); !cat.asOf || deleted != strings.Contains(cat.asOfSrc, "scd_deleted") {
		stmts = append(stmts, asOfFunction(spec.Schema, spec.Target, "CREATE OR REPLACE", deleted))
	}
	if len(stmts) > 0 {
		if err := inDDLTx(ctx, pool, "scd2sink table "+hist, stmts); err != nil {
			return nil, fmt.Errorf("creating history table %s: %w", hist, err)
		}
	}
	if err := t.load(ctx, pool); err != nil {
		return nil, err
	}
	if err := t.loadPartitions(ctx, pool, cat.has(n.hist)); err != nil {
		return nil, err
	}
	views, err := t.viewStatements(ctx, pool)
	if err != nil {
		return nil, err
	}
	var vs []string
	for i, v := range views {
		name := spec.Views[i].Name
		if tag := viewTag(v); cat.notes[name] != tag {
			vs = append(vs, v, fmt.Sprintf("COMMENT ON VIEW %s IS %s", pgx.Identifier{spec.Schema, name}.Sanitize(), quoteLiteral(tag)))
		}
	}
	if len(vs) > 0 {
		if err := inDDLTx(ctx, pool, "scd2sink views of "+hist, vs); err != nil {
			return nil, fmt.Errorf("creating the views of %s: %w", hist, err)
		}
	}
	// The side table mirrors the history table's source columns and types.
	stmts = nil
	if !cat.has(n.side) {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
			scd_seq bytea NOT NULL, scd_op text NOT NULL, scd_t timestamptz NOT NULL, scd_hash bytea NOT NULL, scd_unavailable text[], scd_absent text[], scd_raw_t timestamptz, scd_attnum smallint)`, side))
	}
	var adds []string
	sideDefault := false
	for _, c := range []string{"scd_absent text[]", "scd_raw_t timestamptz", "scd_attnum " + upgradeAttnum} { // side tables of older versions
		if name, _, _ := strings.Cut(c, " "); cat.has(n.side) && !cat.hasCol(n.side, name) {
			adds = append(adds, "ADD COLUMN IF NOT EXISTS "+c)
			sideDefault = sideDefault || (name == "scd_attnum" && upgradeAttnum != "smallint")
		}
	}
	for _, c := range t.cols {
		switch typ := cat.colType(n.side, c.name); {
		case !cat.hasCol(n.side, c.name):
			adds = append(adds, fmt.Sprintf("ADD COLUMN IF NOT EXISTS %s %s", pgx.Identifier{c.name}.Sanitize(), c.fullType))
		case typ != c.fullType:
			// The history column's type changed (an operator widened it
			// to take values that were dead-lettered, or the service did):
			// the side table follows, so that a replay fits there too.
			id := pgx.Identifier{c.name}.Sanitize()
			adds = append(adds, fmt.Sprintf("ALTER COLUMN %s TYPE %s USING %s::%s", id, c.fullType, id, c.fullType))
		}
	}
	if len(adds) > 0 {
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s %s", side, strings.Join(adds, ", ")))
	}
	if sideDefault {
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ALTER COLUMN scd_attnum DROP DEFAULT", side))
	}
	if !cat.has(n.sideIndex) && !cat.has(n.oldSideIndex) {
		stmts = append(stmts, fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (%s, scd_seq)`,
			pgx.Identifier{n.sideIndex}.Sanitize(), side, keyIdents))
	}
	if !cat.has(n.repairs) {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			repaired_at timestamptz NOT NULL DEFAULT now(), key jsonb NOT NULL, cause_seq bytea,
			before jsonb NOT NULL, after jsonb, omitted integer NOT NULL DEFAULT 0)`, t.repairs.Sanitize()))
	} else if !cat.hasCol(n.repairs, "omitted") {
		stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS omitted integer NOT NULL DEFAULT 0`, t.repairs.Sanitize()))
	}
	if len(stmts) > 0 {
		if err := inDDLTx(ctx, pool, "scd2sink table "+hist, stmts); err != nil {
			return nil, fmt.Errorf("creating side table %s: %w", side, err)
		}
	}
	return t, nil
}
