package sink

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
	"github.com/scd2sink/scd2sink/sink/fold"
	"go.uber.org/zap"
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
const (
	partCurrent = "_pcur"
	partClosed  = "_pold"
)

// partitions is what a table knows of its closed versions' partitions.
type partitions struct {
	interval string
	ahead    int
	schema   string
	hist     string         // the history table's name
	old      pgx.Identifier // <hist>_pold
	pool     querier        // reads the committed catalog
	mu       sync.Mutex
	ranges   []timeRange // attached, by lo
}

// timeRange is one attached partition of closed versions.
type timeRange struct {
	name   string
	lo, hi time.Time
}

// intervalStart is the start (UTC) of the interval holding at.
func intervalStart(at time.Time, interval string) time.Time {
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

// intervalNext is the start of the interval after the one starting at lo.
func intervalNext(lo time.Time, interval string) time.Time {
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

// readPartitions reads the attached partitions of old with their bounds
// (a partition bounded by MINVALUE or MAXVALUE, or a DEFAULT one, counts
// as open on that side).
func readPartitions(ctx context.Context, q querier, old pgx.Identifier) ([]timeRange, error) {
	rows, err := q.Query(ctx, `SELECT c.relname::text,
			(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
			(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)`, old.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("reading the partitions of %s: %w", old.Sanitize(), err)
	}
	var out []timeRange
	for rows.Next() {
		var r timeRange
		var lo, hi pgtype.Timestamptz
		if err := rows.Scan(&r.name, &lo, &hi); err != nil {
			rows.Close()
			return nil, err
		}
		// Unbounded (MINVALUE, MAXVALUE, DEFAULT, infinity) is open.
		r.lo, r.hi = time.Time{}, time.Date(294276, 1, 1, 0, 0, 0, 0, time.UTC)
		if lo.Valid && lo.InfinityModifier == pgtype.Finite {
			r.lo = lo.Time
		}
		if hi.Valid && hi.InfinityModifier == pgtype.Finite {
			r.hi = hi.Time
		} else if hi.Valid && hi.InfinityModifier == pgtype.NegativeInfinity {
			r.hi = time.Time{}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the partitions of %s: %w", old.Sanitize(), err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].lo.Before(out[j].lo) })
	return out, nil
}

// covered reports whether a partition of rs holds valid_to at.
func covered(rs []timeRange, at time.Time) bool {
	for _, r := range rs {
		if !at.Before(r.lo) && at.Before(r.hi) {
			return true
		}
	}
	return false
}

// ensure makes sure a partition holds every time of need, creating the
// missing ones in tx (under the table's advisory lock, after reading the
// catalog again: another writer may have created them).
func (p *partitions) ensure(ctx context.Context, tx pgx.Tx, need []time.Time) error {
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
	committed, err := readPartitions(ctx, p.pool, p.old)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ranges = committed
	p.mu.Unlock()
	missing = slices.DeleteFunc(missing, func(at time.Time) bool { return covered(committed, at) })
	if len(missing) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "scd2sink partitions "+p.old.Sanitize()); err != nil {
		return fmt.Errorf("waiting to create partitions of %s: %w", p.old.Sanitize(), err)
	}
	// What this transaction sees, its own uncommitted partitions too, is
	// never remembered: it may roll back.
	rs, err := readPartitions(ctx, tx, p.old)
	if err != nil {
		return err
	}
	var made []time.Time
	for _, at := range missing {
		lo := intervalStart(at, p.interval)
		if covered(rs, at) || slices.ContainsFunc(made, lo.Equal) {
			continue
		}
		hi := intervalNext(lo, p.interval)
		// An interval that other partitions overlap in part (made by
		// hand, or under another interval) is cut to the gap around at.
		for _, r := range rs {
			if !r.hi.After(at) && r.hi.After(lo) {
				lo = r.hi
			}
			if r.lo.After(at) && r.lo.Before(hi) {
				hi = r.lo
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
		rs = append(rs, timeRange{name: name[1], lo: lo, hi: hi})
	}
	return nil
}

// closedTimes are the valid_to of the versions w writes closed.
func (w *writes) closedTimes() []time.Time {
	var out []time.Time
	for _, vs := range [][]*fold.Version{w.closeOnly, w.full, w.insVersions} {
		for _, v := range vs {
			if v.Closed {
				out = append(out, v.To)
			}
		}
	}
	return out
}

// ahead creates, in a transaction of its own, the partitions of the
// current interval at now and of the Ahead intervals after it.
func (p *partitions) aheadOf(ctx context.Context, s *Sink, now time.Time) error {
	need := []time.Time{intervalStart(now, p.interval)}
	for range p.ahead {
		need = append(need, intervalNext(need[len(need)-1], p.interval))
	}
	_, err := s.withRetry(ctx, "partitions", "creating partitions of "+p.old.Sanitize(), func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return p.ensure(ctx, tx, need) })
	})
	return err
}

// PartitionsAhead creates the partitions Ahead intervals after now's for
// every partitioned table the sink has prepared (run calls it hourly).
func (s *Sink) PartitionsAhead(ctx context.Context, now time.Time) error {
	s.mu.Lock()
	var ps []*partitions
	for _, t := range s.tables {
		if t.parts != nil {
			ps = append(ps, t.parts)
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, p := range ps {
		if err := p.aheadOf(ctx, s, now); err != nil {
			errs = append(errs, err) // the next table's go on
		}
	}
	return errors.Join(errs...)
}

// dropEmptyBefore drops the partitions of closed versions whose range ends
// at or before horizon and that hold no row any more, each in a fenced
// transaction of its own; it returns how many it dropped. Detaching takes
// ACCESS EXCLUSIVE on _pold for a moment, waited for at most lock_timeout.
func (s *Sink) dropEmptyBefore(ctx context.Context, spec TableSpec, p *partitions, horizon time.Time) (int, error) {
	rs, err := readPartitions(ctx, s.pool, p.old)
	if err != nil {
		return 0, err
	}
	dropped := 0
	for _, r := range rs {
		if r.hi.After(horizon) {
			continue
		}
		name := pgx.Identifier{p.schema, r.name}
		gone := false
		// One try per pass: DETACH waits for every reader of _pold, and
		// readers queue behind it while it waits, so it waits briefly.
		err := func() error {
			return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				if err := s.lockTargetWriters(ctx, tx, spec, []string{spec.Target}); err != nil {
					return err
				}
				var empty bool
				if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT NOT EXISTS (SELECT 1 FROM %s)`, name.Sanitize())).Scan(&empty); err != nil {
					return fmt.Errorf("looking into partition %s: %w", name.Sanitize(), err)
				}
				if !empty {
					return nil
				}
				for _, st := range []string{
					`SET LOCAL lock_timeout = '200ms'`,
					fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, p.old.Sanitize(), name.Sanitize()),
					fmt.Sprintf(`DROP TABLE %s`, name.Sanitize()),
				} {
					if _, err := tx.Exec(ctx, st); err != nil {
						return fmt.Errorf("dropping partition %s: %w", name.Sanitize(), err)
					}
				}
				gone = true
				// Writers that remember the partition read the catalog
				// again if they meet a row without one (noPartition).
				return s.countOutsideWrite(ctx, tx)
			})
		}()
		if err != nil {
			return dropped, err
		}
		if gone {
			dropped++
		}
	}
	if dropped > 0 {
		rs, err := readPartitions(ctx, s.pool, p.old)
		if err != nil {
			return dropped, err
		}
		p.mu.Lock()
		p.ranges = rs
		p.mu.Unlock()
	}
	return dropped, nil
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
func (t *table) loadPartitions(ctx context.Context, pool querier, existed bool) error {
	old := pgx.Identifier{t.spec.Schema, t.spec.Target + partClosed}
	var kind string
	if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT c.relkind::text FROM pg_class c WHERE c.oid = to_regclass($1)), '')`, old.Sanitize()).Scan(&kind); err != nil {
		return fmt.Errorf("looking for %s: %w", old.Sanitize(), err)
	}
	if kind != "p" {
		if t.spec.Partitioning.Interval != "" && existed {
			t.plainButPartitioned = true
		}
		return nil
	}
	interval, ahead := t.spec.Partitioning.Interval, t.spec.Partitioning.Ahead
	if interval == "" {
		interval, ahead = "month", 3 // partitioning taken out of the config: the table still needs partitions
	}
	p := &partitions{interval: interval, ahead: ahead, schema: t.spec.Schema, hist: t.spec.Target, old: old, pool: pool}
	rs, err := readPartitions(ctx, pool, old)
	if err != nil {
		return err
	}
	p.ranges = rs
	t.parts = p
	need := []time.Time{intervalStart(time.Now(), interval)}
	for range ahead {
		need = append(need, intervalNext(need[len(need)-1], interval))
	}
	if db, ok := pool.(beginner); ok {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return p.ensure(ctx, tx, need) })
	}
	return nil
}

// beginner starts transactions (a pool).
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// warnPlain logs, once per table, that a table configured with
// partitioning exists unpartitioned and is left as it is.
func (s *Sink) warnPlain(t *table) {
	if t == nil || !t.plainButPartitioned {
		return
	}
	if _, done := s.plainWarned.LoadOrStore(t.spec.Target, true); !done {
		s.log.Warn("the history table exists unpartitioned and is left as it is: partitioning applies to tables the service creates; migrate with scd2sink rebuild (docs/history-tables.md)",
			zap.String("target", t.spec.Target))
	}
}

// noPartition reports whether err is PostgreSQL finding no partition for a
// row: a partition dropped since it was cached (retention, by another
// instance). Transient: the cache is dropped and the batch tried again.
func noPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.HasPrefix(pgErr.Message, "no partition of relation")
}

// forget drops what p remembers of the partitions.
func (p *partitions) forget() {
	p.mu.Lock()
	p.ranges = nil
	p.mu.Unlock()
}
