// Package carry reads a history table back as the events that built it,
// so that a table about to be replaced keeps what only it still holds
// (DESIGN.md section 13).
//
// # Invariants
//
// A history table is enough to rebuild each key's events (sink/doc.go,
// "Why this state is enough"): its side rows, the opening event of every
// version without a side row of the same sequence (its image is the
// version's row, its time the version's unclamped valid_from), and the
// table's truncates. A rebuild replays what Kafka still holds into a fresh
// table; Read then gives the events of the live table that the fresh one
// has not seen — no version and no side row of the same key and sequence,
// no truncate of the same sequence — and the rebuild applies them as late
// events through the normal path. The fresh table then holds the fold of
// every event ever applied to the live table and of every event Kafka
// still holds: a version whose opening event Kafka lost (retention moved
// the log start, compaction kept only each key's latest record, records
// were deleted) is carried with its values, valid_from, sequence and
// content digest, so the swap keeps its scd_id; the delete or truncate
// that closed it is carried the same way when Kafka lost it too.
//
// What is carried is the live table's record of an event: a version's
// Type 1 columns as it holds them (with type1_scope all_versions those
// are the key's last values anyway), and no event a retention pass
// removed (its 'h' side row is not an event).
package carry

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/pgcodec"
)

// Pair names a live history table and the table replacing it, both in
// Schema. Target is the name the replacing table's events carry (the
// sink's target for Into).
type Pair struct {
	Schema string
	Live   string
	Into   string
}

// Counts is what Read carried.
type Counts struct {
	Events    int64 // events carried, truncates included
	Versions  int64 // of them, events that opened a version in the live table
	Truncates int64
}

// column is a source column of a history table.
type column struct {
	name   string
	typ    string // format_type with modifier
	attnum int16
}

func columns(ctx context.Context, pool *pgxpool.Pool, rel string) ([]column, error) {
	all, err := allColumns(ctx, pool, rel)
	var out []column
	for _, c := range all {
		if !catalog.IsBookkeeping(c.name) && c.name != "scd_deleted" {
			out = append(out, c)
		}
	}
	return out, err
}

// allColumns are every column of rel, bookkeeping ones too.
func allColumns(ctx context.Context, pool *pgxpool.Pool, rel string) ([]column, error) {
	rows, err := pool.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod), attnum FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, rel)
	if err != nil {
		return nil, fmt.Errorf("reading the columns of %s: %w", rel, err)
	}
	defer rows.Close()
	var out []column
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.name, &c.typ, &c.attnum); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// plan is what Read needs of the two tables.
type plan struct {
	keys     []string // key columns, in the key index's order
	cols     []column // the live table's source columns (keys included)
	intoType map[string]string
}

// prepare compares the tables' keys and, when carrying, gives the
// replacing table (and its side table) every source column of the live
// table it lacks, with the live table's type: a column Kafka's records no
// longer carry (dropped at the source before the log start) still has
// values in carried versions; and it refuses a column whose type changed
// in a way that would change a carried value.
func prepare(ctx context.Context, pool *pgxpool.Pool, p Pair, carrying bool) (*plan, error) {
	id := func(n string) string { return pgx.Identifier{p.Schema, n}.Sanitize() }
	liveKeys, err := sink.KeyColumns(ctx, pool, p.Schema, p.Live)
	if err != nil {
		return nil, err
	}
	intoKeys, err := sink.KeyColumns(ctx, pool, p.Schema, p.Into)
	if err != nil {
		return nil, err
	}
	if len(liveKeys) == 0 || !slices.Equal(liveKeys, intoKeys) {
		return nil, fmt.Errorf("%s is keyed by (%s) and its rebuild by (%s): versions cannot be carried across a change of key; "+
			"rebuild --from-scratch keeps only what Kafka holds", p.Live, strings.Join(liveKeys, ", "), strings.Join(intoKeys, ", "))
	}
	live, err := columns(ctx, pool, id(p.Live))
	if err != nil {
		return nil, err
	}
	into, err := columns(ctx, pool, id(p.Into))
	if err != nil {
		return nil, err
	}
	types := map[string]string{}
	for _, c := range into {
		types[c.name] = c.typ
	}
	var adds []string
	for _, c := range live {
		it, ok := types[c.name]
		if !carrying {
			continue // counting reads the keys alone
		}
		if !ok {
			adds = append(adds, fmt.Sprintf("ADD COLUMN IF NOT EXISTS %s %s", pgx.Identifier{c.name}.Sanitize(), c.typ))
			types[c.name] = c.typ
			continue
		}
		if it == c.typ {
			continue
		}
		// The source changed the column's type since the live table's
		// versions were written (a narrower varchar, fewer decimals): a
		// carried value must not change on its way. Every value of the
		// live table must come back from the rebuilt table's type as it
		// was, or the rebuild stops before the swap.
		q := pgx.Identifier{c.name}.Sanitize()
		var lost int64
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s IS DISTINCT FROM (%[2]s::%s)::%s`, id(p.Live), q, it, c.typ)).Scan(&lost); err != nil || lost > 0 {
			what := fmt.Sprintf("%d values", lost)
			if err != nil {
				what = "values (" + err.Error() + ")"
			}
			return nil, fmt.Errorf("column %s is of type %s in %s and %s in its rebuild (the source changed it): %s of the live table would change "+
				"if carried; nothing is swapped in and %s stays as it is (rebuild --from-scratch keeps only what Kafka holds)", c.name, c.typ, p.Live, it, what, p.Live)
		}
	}
	if len(adds) > 0 {
		for _, rel := range []string{p.Into, p.Into + "_scd_events"} {
			if _, err := pool.Exec(ctx, fmt.Sprintf("ALTER TABLE %s %s", id(rel), strings.Join(adds, ", "))); err != nil {
				return nil, fmt.Errorf("giving %s the columns of %s: %w", rel, p.Live, err)
			}
		}
	}
	return &plan{keys: liveKeys, cols: live, intoType: types}, nil
}

// query renders the live table's events the replacing table has not
// seen, in key and sequence order: keys and source columns (cast to the
// replacing table's types), then scd_seq, scd_op, the unclamped time,
// scd_hash, scd_absent, scd_attnum and whether it opened a version.
func (pl *plan) query(p Pair, count bool) string {
	id := func(n string) string { return pgx.Identifier{p.Schema, n}.Sanitize() }
	q := func(n string) string { return pgx.Identifier{n}.Sanitize() }
	match := func(a, b string, cast bool) string {
		parts := make([]string, len(pl.keys))
		for i, k := range pl.keys {
			rhs := b + "." + q(k)
			if cast {
				rhs += "::" + pl.intoType[k]
			}
			parts[i] = fmt.Sprintf("%s.%s = %s", a, q(k), rhs)
		}
		return strings.Join(parts, " AND ")
	}
	names := make([]string, len(pl.cols))
	for i, c := range pl.cols {
		names[i] = q(c.name)
	}
	list := func(prefix string) string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = prefix + n
		}
		return strings.Join(out, ", ")
	}
	inner := fmt.Sprintf(`SELECT %[1]s, l.scd_seq, l.scd_op, coalesce(l.scd_raw_t, l.valid_from) AS scd_t, l.scd_hash, l.scd_absent, l.scd_attnum, true AS scd_opens
			FROM %[2]s l WHERE NOT EXISTS (SELECT 1 FROM %[3]s s WHERE %[4]s AND s.scd_seq = l.scd_seq)
		UNION ALL
		SELECT %[5]s, s.scd_seq, s.scd_op, coalesce(s.scd_raw_t, s.scd_t), s.scd_hash, s.scd_absent, s.scd_attnum,
			EXISTS (SELECT 1 FROM %[2]s l WHERE %[4]s AND l.scd_seq = s.scd_seq)
			FROM %[3]s s WHERE s.scd_op IN ('c', 'r', 'u', 'd')`,
		list("l."), id(p.Live), id(p.Live+"_scd_events"), match("s", "l", false), list("s."))
	unseen := fmt.Sprintf(`NOT EXISTS (SELECT 1 FROM %[1]s r WHERE %[3]s AND r.scd_seq = x.scd_seq)
		AND NOT EXISTS (SELECT 1 FROM %[2]s r WHERE %[3]s AND r.scd_seq = x.scd_seq)`,
		id(p.Into), id(p.Into+"_scd_events"), match("r", "x", true))
	if count {
		return fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE x.scd_opens) FROM (%s) x WHERE %s`, inner, unseen)
	}
	sel := make([]string, len(pl.cols))
	for i, c := range pl.cols {
		sel[i] = fmt.Sprintf("x.%s::%s", q(c.name), pl.intoType[c.name])
	}
	order := make([]string, len(pl.keys))
	for i, k := range pl.keys {
		order[i] = "x." + q(k)
	}
	return fmt.Sprintf(`SELECT %s, x.scd_seq, x.scd_op, x.scd_t, x.scd_hash, x.scd_absent, x.scd_attnum, x.scd_opens
		FROM (%s) x WHERE %s ORDER BY %s, x.scd_seq`, strings.Join(sel, ", "), inner, unseen, strings.Join(order, ", "))
}

// truncates renders the live table's truncates the replacing one lacks.
func truncates(p Pair) (string, []any) {
	t := pgx.Identifier{p.Schema, "scd2sink_truncates"}.Sanitize()
	return fmt.Sprintf(`SELECT l.scd_seq, l.valid_from FROM %[1]s l WHERE l.target = $1
		AND NOT EXISTS (SELECT 1 FROM %[1]s r WHERE r.target = $2 AND r.scd_seq = l.scd_seq) ORDER BY l.scd_seq`, t),
		[]any{pgx.Identifier{p.Schema, p.Live}.Sanitize(), pgx.Identifier{p.Schema, p.Into}.Sanitize()}
}

// readConn is a connection of its own for one long read (the pool's
// connections stay the sink's: a pool of one or two cannot starve), with
// the sink's codecs, and without statement_timeout: reading a table of
// tens of millions of versions, and streaming it while its chunks are
// applied, may take longer than any statement the service runs. Close it.
func readConn(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("connecting to read: %w", err)
	}
	pgcodec.Register(conn.TypeMap())
	if _, err := conn.Exec(ctx, "SET statement_timeout = 0"); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// Count says how many events, and of them version openers, Read would
// carry, changing neither table.
func Count(ctx context.Context, pool *pgxpool.Pool, p Pair) (Counts, error) {
	pl, err := prepare(ctx, pool, p, false)
	if err != nil {
		return Counts{}, err
	}
	var c Counts
	if err := pool.QueryRow(ctx, pl.query(p, true)).Scan(&c.Events, &c.Versions); err != nil {
		return Counts{}, fmt.Errorf("counting the versions of %s its rebuild lacks: %w", p.Live, err)
	}
	tq, args := truncates(p)
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM ("+tq+") t", args...).Scan(&c.Truncates); err != nil {
		return Counts{}, fmt.Errorf("counting the truncates of %s its rebuild lacks: %w", p.Live, err)
	}
	c.Events += c.Truncates
	return c, nil
}

// Read streams the live table's events that the replacing table has not
// seen to apply, in chunks of about chunk events (a key's events are
// never split unless it alone has more than 8 times chunk), in key and
// sequence order, the truncates last. It reads from one statement's
// snapshot: what apply writes into the replacing table meanwhile does
// not change what is carried. The chunks' events are apply's to keep.
func Read(ctx context.Context, pool *pgxpool.Pool, p Pair, chunk int, apply func([]*change.Event) error) (Counts, error) {
	pl, err := prepare(ctx, pool, p, true)
	if err != nil {
		return Counts{}, err
	}
	// Values as the sink reads them back (json as its text, the fast
	// codecs): what the sink stores is what it would read.
	conn, err := readConn(ctx, pool)
	if err != nil {
		return Counts{}, err
	}
	defer conn.Close(context.Background())
	var c Counts
	rows, err := conn.Query(ctx, pl.query(p, false))
	if err != nil {
		return c, fmt.Errorf("reading the versions of %s its rebuild lacks: %w", p.Live, err)
	}
	defer rows.Close()
	nk, nc := len(pl.keys), len(pl.cols)
	keyAt := make([]int, nk)
	for i, k := range pl.keys {
		keyAt[i] = slices.IndexFunc(pl.cols, func(c column) bool { return c.name == k })
		if keyAt[i] < 0 {
			return c, fmt.Errorf("%s lacks its key column %s", p.Live, k)
		}
	}
	var batch []*change.Event
	var lastKey string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := apply(batch)
		batch = nil
		return err
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return c, fmt.Errorf("reading the versions of %s its rebuild lacks: %w", p.Live, err)
		}
		seq, _ := vals[nc].([]byte)
		op, _ := vals[nc+1].(string)
		at, _ := vals[nc+2].(time.Time)
		hash, _ := vals[nc+3].([]byte)
		ev := &change.Event{Table: p.Into, Seq: change.Seq(seq), ValidFrom: at, Key: make([]any, nk)}
		for i := range nk {
			ev.Key[i] = sink.Stored(vals[keyAt[i]])
		}
		if op == "" {
			op = "u"
		}
		ev.Op = change.Op(op[0])
		if ev.Op.HasAfter() {
			absent := map[string]bool{}
			for _, a := range asStrings(vals[nc+4]) {
				absent[a] = true
			}
			attnum, known := vals[nc+5].(int16)
			ev.After = make(map[string]any, nc)
			for i, col := range pl.cols {
				if absent[col.name] || (known && col.attnum > attnum && !slices.Contains(pl.keys, col.name)) {
					continue // a column the row does not know: absent from the event too
				}
				ev.After[col.name] = sink.Stored(vals[i])
			}
		}
		ev.SetHash(hash)
		if opens, _ := vals[nc+6].(bool); opens {
			c.Versions++
		}
		c.Events++
		k := change.KeyID(ev.Key)
		if len(batch) >= 8*chunk || (len(batch) >= chunk && k != lastKey) {
			if err := flush(); err != nil {
				return c, err
			}
		}
		lastKey = k
		batch = append(batch, ev)
	}
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("reading the versions of %s its rebuild lacks: %w", p.Live, err)
	}
	rows.Close()
	tq, args := truncates(p)
	trows, err := conn.Query(ctx, tq, args...)
	if err != nil {
		return c, fmt.Errorf("reading the truncates of %s its rebuild lacks: %w", p.Live, err)
	}
	var truncs []*change.Event
	for trows.Next() {
		var seq []byte
		var at time.Time
		if err := trows.Scan(&seq, &at); err != nil {
			trows.Close()
			return c, err
		}
		truncs = append(truncs, &change.Event{Table: p.Into, Op: change.OpTruncate, Seq: change.Seq(seq), ValidFrom: at})
	}
	trows.Close()
	if err := trows.Err(); err != nil {
		return c, err
	}
	if err := flush(); err != nil {
		return c, err
	}
	c.Truncates = int64(len(truncs))
	c.Events += c.Truncates
	for len(truncs) > 0 {
		n := min(len(truncs), max(chunk, 1))
		batch = truncs[:n]
		truncs = truncs[n:]
		if err := flush(); err != nil {
			return c, err
		}
	}
	return c, nil
}

func asStrings(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
