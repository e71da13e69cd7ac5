package catalog

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Partitioned history tables (partitioning: in the config, DESIGN.md
// section 12). The table is partitioned by LIST (is_current): the current
// versions live in <target>_pcur, the closed ones in <target>_pold, which
// is partitioned by RANGE (valid_to) into one partition per interval
// (<target>_p2026, _p202601, _p20260115 for year, month, day).
//
// Why valid_to and not valid_from: a closed version never becomes current
// again except in a repair, and a partition of closed versions whose
// range ends before a retention horizon holds only versions retention
// removes, so it can go whole; partitions by valid_from would keep every
// old partition alive for the one version in it that is still current.
// Closing a version moves its row from _pcur to its interval's partition
// (PostgreSQL turns the UPDATE into a delete and an insert).
//
// There is no DEFAULT partition: attaching a partition next to one locks
// the default ACCESS EXCLUSIVE to scan it, which blocks every reader.
// Instead, a batch that closes a version into an interval without a
// partition creates it in its transaction, first (CREATE TABLE ... LIKE, then
// ATTACH PARTITION: SHARE UPDATE EXCLUSIVE on _pold, which neither readers
// nor writers conflict with), under an advisory lock per table so that two
// writers never create the same one. Partitions Ahead intervals after the
// current one are created when the table is prepared and by run's hourly
// pass. Retention drops a partition whose range ends at or before its
// horizon once its rows are gone (retention.go).
//
// Unique indexes of a partitioned table must hold the partition keys: the
// key index is (key, scd_seq, is_current, valid_to) NULLS NOT DISTINCT
// and the scd_id index (scd_id, is_current, valid_to) NULLS NOT DISTINCT
// (PostgreSQL 15 or later). They are unique per partition; scd_id stays
// unique because the identity column gives it, and verify checks one
// current version per key as before.
//
// The directory <target>_pdir holds a row (the key, and a lower bound of
// its latest version's valid_to) for every key whose latest version is
// closed: written in the transaction that closes it (a superset: a key
// re-opened since keeps its row). A key without a current version and
// without a row has no version at all, and a batch reads nothing of it
// from the partitions of closed versions; a key with one is read from
// the partitions from its bound on (every version of a key ends at or
// before its latest's valid_to), and from all of them if that finds
// nothing (the bound is only a hint: retention may have removed the
// version). Without it, every new key of a batch was looked up in every
// partition of closed versions.
const (
	partCurrent = "_pcur"
	partClosed  = "_pold"
	partDir     = "_pdir"
)

// DirSuffix ends the name of a partitioned table's key directory, and
// DirKeySuffix that of its primary key (named, so that a rebuild's swap
// can rename it along).
const (
	DirSuffix    = partDir
	DirKeySuffix = "_scd_dir_key"
)

// Partitions is what a table knows of its closed versions' partitions.
type Partitions struct {
	interval string
	ahead    int
	schema   string
	hist     string         // the history table's name
	old      pgx.Identifier // <hist>_pold
	dir      pgx.Identifier // <hist>_pdir
	pool     Querier        // reads the committed catalog
	mu       sync.Mutex
	ranges   []Range // attached, by lo
}

// Range is one attached partition of closed versions.
type Range struct {
	Name   string
	Lo, Hi time.Time
}

// IntervalStart is the start (UTC) of the interval holding at.
func IntervalStart(at time.Time, interval string) time.Time {
	at = at.UTC()
	switch interval {
	case "day":
		return time.Date(at.Year(), at.Month(), at.Day(), 0, 0, 0, 0, time.UTC)
	case "year":
		return time.Date(at.Year(), 1, 1, 0, 0, 0, 0, time.UTC)
	default:
		return time.Date(at.Year(), at.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
}

// IntervalNext is the start of the interval after the one starting at lo.
func IntervalNext(lo time.Time, interval string) time.Time {
	switch interval {
	case "day":
		return lo.AddDate(0, 0, 1)
	case "year":
		return lo.AddDate(1, 0, 0)
	default:
		return lo.AddDate(0, 1, 0)
	}
}

// partitionSuffix names the partition of the interval starting at lo.
func partitionSuffix(lo time.Time, interval string) string {
	switch interval {
	case "day":
		return lo.Format("_p20060102")
	case "year":
		return lo.Format("_p2006")
	default:
		return lo.Format("_p200601")
	}
}

// partitionedDDL creates the history table hist partitioned, with its two
// first-level partitions and its indexes; columns is the column list.
func partitionedDDL(schema, hist, columns, keyIndex, idIndex, keyIdents string) []string {
	id := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (%s) PARTITION BY LIST (is_current)`, id(hist), columns),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES IN (true) WITH (fillfactor = 70)`, id(hist+partCurrent), id(hist)),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES IN (false) PARTITION BY RANGE (valid_to)`, id(hist+partClosed), id(hist)),
		fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (%s, scd_seq, is_current, valid_to) NULLS NOT DISTINCT`,
			pgx.Identifier{keyIndex}.Sanitize(), id(hist), keyIdents),
		fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s ON %s (scd_id, is_current, valid_to) NULLS NOT DISTINCT`,
			pgx.Identifier{idIndex}.Sanitize(), id(hist)),
	}
}

// ReadPartitions reads the attached partitions of old with their bounds
// (a partition bounded by MINVALUE or MAXVALUE, or a DEFAULT one, counts
// as open on that side).
func ReadPartitions(ctx context.Context, q Querier, old pgx.Identifier) ([]Range, error) {
	rows, err := q.Query(ctx, `SELECT c.relname::text,
			(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
			(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)`, old.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("reading the partitions of %s: %w", old.Sanitize(), err)
	}
	var out []Range
	for rows.Next() {
		var r Range
		var lo, hi pgtype.Timestamptz
		if err := rows.Scan(&r.Name, &lo, &hi); err != nil {
			rows.Close()
			return nil, err
		}
		// Unbounded (MINVALUE, MAXVALUE, DEFAULT, infinity) is open.
		r.Lo, r.Hi = time.Time{}, time.Date(294276, 1, 1, 0, 0, 0, 0, time.UTC)
		if lo.Valid && lo.InfinityModifier == pgtype.Finite {
			r.Lo = lo.Time
		}
		if hi.Valid && hi.InfinityModifier == pgtype.Finite {
			r.Hi = hi.Time
		} else if hi.Valid && hi.InfinityModifier == pgtype.NegativeInfinity {
			r.Hi = time.Time{}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the partitions of %s: %w", old.Sanitize(), err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Lo.Before(out[j].Lo) })
	return out, nil
}

// covered reports whether a partition of rs holds valid_to at.
func covered(rs []Range, at time.Time) bool {
	for _, r := range rs {
		if !at.Before(r.Lo) && at.Before(r.Hi) {
			return true
		}
	}
	return false
}

// Ensure makes sure a partition holds every time of need, creating the
// missing ones in tx (under the table's advisory lock, after reading the
// catalog again: another writer may have created them). When one is
// missing it reads the committed partitions on a second connection of
// the pool while tx holds one: a batch's parts, at most two fewer than
// the pool's connections, leave it one (EnsureOwn holds one alone).
func (p *Partitions) Ensure(ctx context.Context, tx pgx.Tx, need []time.Time) error {
	p.mu.Lock()
	var missing []time.Time
	for _, at := range need {
		if !covered(p.ranges, at) {
			missing = append(missing, at)
		}
	}
	p.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	// The cache holds only what committed transactions made: read them
	// again outside tx first (another writer, or an earlier batch of
	// this one, may have made what is missing).
	committed, err := ReadPartitions(ctx, p.pool, p.old)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ranges = committed
	p.mu.Unlock()
	return p.create(ctx, tx, slices.DeleteFunc(missing, func(at time.Time) bool { return covered(committed, at) }))
}

// EnsureOwn is Ensure in a transaction of its own on pool: the committed
// partitions are read before it begins, so that it holds one connection
// at a time (Ensure, inside a caller's transaction, reads them on a
// second one).
func (p *Partitions) EnsureOwn(ctx context.Context, pool *pgxpool.Pool, need []time.Time) error {
	committed, err := ReadPartitions(ctx, pool, p.old)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ranges = committed
	p.mu.Unlock()
	missing := slices.DeleteFunc(slices.Clone(need), func(at time.Time) bool { return covered(committed, at) })
	if len(missing) == 0 {
		return nil
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return p.create(ctx, tx, missing) })
}

// create makes partitions for the times of missing that the committed
// partitions do not hold, in tx. It uses tx's connection alone: a caller
// holding tx never waits for a second connection of the pool (callers
// side by side could hold every connection, each waiting for another).
func (p *Partitions) create(ctx context.Context, tx pgx.Tx, missing []time.Time) error {
	if len(missing) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "scd2sink partitions "+p.old.Sanitize()); err != nil {
		return fmt.Errorf("waiting to create partitions of %s: %w", p.old.Sanitize(), err)
	}
	// What this transaction sees, its own uncommitted partitions too, is
	// never remembered: it may roll back.
	rs, err := ReadPartitions(ctx, tx, p.old)
	if err != nil {
		return err
	}
	var made []time.Time
	for _, at := range missing {
		lo := IntervalStart(at, p.interval)
		if covered(rs, at) || slices.ContainsFunc(made, lo.Equal) {
			continue
		}
		hi := IntervalNext(lo, p.interval)
		// An interval that other partitions overlap in part (made by
		// hand, or under another interval) is cut to the gap around at.
		for _, r := range rs {
			if !r.Hi.After(at) && r.Hi.After(lo) {
				lo = r.Hi
			}
			if r.Lo.After(at) && r.Lo.Before(hi) {
				hi = r.Lo
			}
		}
		name := pgx.Identifier{p.schema, p.hist + partitionSuffix(lo, p.interval)}
		lit := func(t time.Time) string { return "'" + t.UTC().Format("2006-01-02 15:04:05Z07:00") + "'" }
		for _, st := range []string{
			fmt.Sprintf(`CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`, name.Sanitize(), p.old.Sanitize()),
			fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%s) TO (%s)`, p.old.Sanitize(), name.Sanitize(), lit(lo), lit(hi)),
		} {
			if _, err := tx.Exec(ctx, st); err != nil {
				return fmt.Errorf("creating partition %s: %w", name.Sanitize(), err)
			}
		}
		made = append(made, lo)
		rs = append(rs, Range{Name: name[1], Lo: lo, Hi: hi})
	}
	return nil
}

// PartitionRenames returns the statements that rename the partitions of
// schema.from (named from + a suffix) after to, for a rebuild's swap:
// partitions keep the names of the table they were made for otherwise,
// and a later rebuild's would collide with them.
func PartitionRenames(ctx context.Context, q Querier, schema, from, to string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT c.relname::text FROM pg_partition_tree(to_regclass($1)) t JOIN pg_class c ON c.oid = t.relid
		WHERE t.level > 0 ORDER BY t.level DESC, c.relname`, pgx.Identifier{schema, from}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("reading the partitions of %s: %w", from, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading the partitions of %s: %w", from, err)
	}
	var out []string
	for _, n := range names {
		suffix, ok := strings.CutPrefix(n, from)
		if !ok || !strings.HasPrefix(suffix, "_p") {
			continue
		}
		base := to
		if len(suffix) > 40 {
			continue // not one the sink named
		}
		if len(base+suffix) > 63 { // a replaced table's long name: cut, and told apart by a hash
			h := fnv.New32a()
			h.Write([]byte(to))
			base = fmt.Sprintf("%s_%08x", to[:63-len(suffix)-9], h.Sum32())
		}
		out = append(out, fmt.Sprintf("ALTER TABLE %s RENAME TO %s", pgx.Identifier{schema, n}.Sanitize(), pgx.Identifier{base + suffix}.Sanitize()))
	}
	return out, nil
}

// loadPartitions finds out whether t's history table is one the sink
// partitioned (its _pold is partitioned) and reads its partitions, then
// creates those ahead of now; existed says the table was there before
// (a plain one configured with partitioning is left as it is, noted).
func (t *Table) loadPartitions(ctx context.Context, pool Querier, existed bool) error {
	old := pgx.Identifier{t.Spec.Schema, t.Spec.Target + partClosed}
	var kind string
	if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT c.relkind::text FROM pg_class c WHERE c.oid = to_regclass($1)), '')`, old.Sanitize()).Scan(&kind); err != nil {
		return fmt.Errorf("looking for %s: %w", old.Sanitize(), err)
	}
	if kind != "p" {
		if t.Spec.Partitioning.Interval != "" && existed {
			t.PlainButPartitioned = true
		}
		return nil
	}
	interval, ahead := t.Spec.Partitioning.Interval, t.Spec.Partitioning.Ahead
	if interval == "" {
		interval, ahead = "month", 3 // partitioning taken out of the config: the table still needs partitions
	}
	p := &Partitions{interval: interval, ahead: ahead, schema: t.Spec.Schema, hist: t.Spec.Target, old: old,
		dir: pgx.Identifier{t.Spec.Schema, t.Spec.Target + partDir}, pool: pool}
	rs, err := ReadPartitions(ctx, pool, old)
	if err != nil {
		return err
	}
	p.ranges = rs
	t.Parts = p
	need := []time.Time{IntervalStart(time.Now(), interval)}
	for range ahead {
		need = append(need, IntervalNext(need[len(need)-1], interval))
	}
	if db, ok := pool.(beginner); ok {
		if err := p.ensureDir(ctx, db, t.Spec.Keys); err != nil {
			return err
		}
		// rs was read just now, committed: the transaction needs no
		// second connection to read them again (create).
		missing := slices.DeleteFunc(need, func(at time.Time) bool { return covered(rs, at) })
		if len(missing) == 0 {
			return nil
		}
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return p.create(ctx, tx, missing) })
	}
	return nil
}

// ensureDir creates p's directory (see partDir) if it is missing, filled
// from the table as it is: a table partitioned by an older release, or
// one created just now (then empty). Writers are held off while it is
// filled (SHARE on the history table, waited for at most lock_timeout;
// readers go on), so that no key is closed between the read and the
// commit; the advisory lock of the table's DDL makes two processes fill
// it once.
func (p *Partitions) ensureDir(ctx context.Context, db beginner, keys []string) error {
	var exists bool
	if err := p.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.dir.Sanitize()).Scan(&exists); err != nil {
		return fmt.Errorf("looking for %s: %w", p.dir.Sanitize(), err)
	}
	if exists {
		return nil
	}
	hist := pgx.Identifier{p.schema, p.hist}.Sanitize()
	cur := pgx.Identifier{p.schema, p.hist + partCurrent}.Sanitize()
	ks := QuoteIdents(keys)
	var match, notNull []string
	for _, k := range keys {
		q := pgx.Identifier{k}.Sanitize()
		match = append(match, fmt.Sprintf("c.%s = o.%s", q, q))
		notNull = append(notNull, "o."+q+" IS NOT NULL")
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1)), set_config('statement_timeout', '0', true)", "scd2sink table "+hist); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.dir.Sanitize()).Scan(&exists); err != nil || exists {
			return err
		}
		for _, st := range []string{
			fmt.Sprintf(`LOCK TABLE %s IN SHARE MODE`, hist),
			// (Each key's latest closed version: the one of the highest
			// sequence.)
			fmt.Sprintf(`CREATE TABLE %s AS SELECT DISTINCT ON (%s) %s, o.valid_to AS last_to FROM %s o
				WHERE %s AND NOT EXISTS (SELECT 1 FROM %s c WHERE %s) ORDER BY %s, o.scd_seq DESC`,
				p.dir.Sanitize(), ks, ks, p.old.Sanitize(), strings.Join(notNull, " AND "), cur, strings.Join(match, " AND "), ks),
			fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN last_to SET NOT NULL, ADD CONSTRAINT %s PRIMARY KEY (%s)`,
				p.dir.Sanitize(), pgx.Identifier{p.hist + DirKeySuffix}.Sanitize(), ks),
			fmt.Sprintf(`COMMENT ON TABLE %s IS 'scd2sink: the keys of %s whose latest version is closed, with a lower bound of its valid_to (a lookup aid written with the history)'`,
				p.dir.Sanitize(), strings.ReplaceAll(hist, "'", "''")),
		} {
			if _, err := tx.Exec(ctx, st); err != nil {
				return fmt.Errorf("%s: %w", FirstLine(st), err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("creating the key directory %s: %w", p.dir.Sanitize(), err)
	}
	return nil
}

// beginner starts transactions (a pool).
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// NoPartition reports whether err is PostgreSQL finding no partition for a
// row: a partition dropped since it was cached (retention, by another
// instance). Transient: the cache is dropped and the batch tried again.
func NoPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.HasPrefix(pgErr.Message, "no partition of relation")
}

// Forget drops what p remembers of the partitions.
func (p *Partitions) Forget() {
	p.mu.Lock()
	p.ranges = nil
	p.mu.Unlock()
}

// Ahead returns the starts of the interval holding now and of the Ahead
// intervals after it: the partitions a table keeps created in advance.
func (p *Partitions) Ahead(now time.Time) []time.Time {
	need := []time.Time{IntervalStart(now, p.interval)}
	for range p.ahead {
		need = append(need, IntervalNext(need[len(need)-1], p.interval))
	}
	return need
}

// Old is <hist>_pold, the parent of the closed versions' partitions.
func (p *Partitions) Old() pgx.Identifier { return p.old }

// Cur is <hist>_pcur, the partition of the current versions.
func (p *Partitions) Cur() pgx.Identifier { return pgx.Identifier{p.schema, p.hist + partCurrent} }

// Dir is <hist>_pdir, the directory of keys whose latest version is
// closed (see partDir).
func (p *Partitions) Dir() pgx.Identifier { return p.dir }

// Schema is the history table's schema, where its partitions are.
func (p *Partitions) Schema() string { return p.schema }

// Reload reads the attached partitions again from q (after some were
// dropped).
func (p *Partitions) Reload(ctx context.Context, q Querier) error {
	rs, err := ReadPartitions(ctx, q, p.old)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ranges = rs
	p.mu.Unlock()
	return nil
}
