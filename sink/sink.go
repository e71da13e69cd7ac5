package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"go.uber.org/zap"
)

// Sink applies batches of change events to SCD2 history tables. Apply (or
// ApplyPrepared) is called from one goroutine at a time, in the order the
// batches' offsets were released; Prepare may run beside it.
type Sink struct {
	mu   sync.Mutex // guards tables against Prepare running beside Init
	cfg  Config
	pool *pgxpool.Pool
	log  *zap.Logger
	conv converter
	// specs (guarded by specMu) are the known targets' specs: the
	// configured ones and those cfg.Resolve gave.
	specMu sync.Mutex
	specs  map[string]TableSpec
	tables map[string]*table
	cache  *stateCache
	// written is the offset this Sink last recorded per partition; another
	// value in scd2sink_offsets means another writer applied that partition.
	written map[change.Partition]int64
	// forgets counts Forget calls; forgot is the count the applying
	// goroutine last acted on. Forget may be called from a rebalance
	// callback while a batch is still being applied (one abandoned after
	// the revoke budget): it only bumps the count, and the applying
	// goroutine, the only one touching cache and written, empties them.
	forgets atomic.Uint64
	forgot  uint64
	// snapshotsPending: scd2sink_snapshots may hold snapshots to reconcile;
	// reconciling guards against reconciling from reconciliation's own
	// batches (reconcile.go). reconciled is the count of reconciled
	// snapshots the fence last saw (-1: none seen yet).
	snapshotsPending bool
	reconciling      bool
	reconciled       int64
	// snapDeletes are the targets with SnapshotDeletes (guarded by specMu).
	snapDeletes map[string]bool
}

// New validates cfg and returns a Sink writing through pool. Call Init before
// the first Apply.
func New(cfg Config, pool *pgxpool.Pool) (*Sink, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Sink{cfg: cfg, pool: pool, log: cfg.Logger, conv: converter{m: pgtype.NewMap()},
		specs: map[string]TableSpec{}, tables: map[string]*table{},
		cache: newStateCache(cfg.CacheKeys, cfg.CacheBytes), written: map[change.Partition]int64{},
		snapshotsPending: true, reconciled: -1}
	s.snapDeletes = map[string]bool{}
	for _, t := range cfg.Tables {
		s.specs[t.Target] = t
		s.snapDeletes[t.Target] = t.SnapshotDeletes
	}
	return s, nil
}

// spec returns target's spec, asking cfg.Resolve for a target it does
// not know yet.
func (s *Sink) spec(target string) (TableSpec, bool) {
	s.specMu.Lock()
	defer s.specMu.Unlock()
	if spec, ok := s.specs[target]; ok {
		return spec, true
	}
	if s.cfg.Resolve == nil {
		return TableSpec{}, false
	}
	spec, ok := s.cfg.Resolve(target)
	if !ok || spec.Target != target {
		return TableSpec{}, false
	}
	if err := s.cfg.specDefaults(&spec); err != nil {
		s.log.Error("a resolved table is not valid", zap.String("target", target), zap.Error(err))
		return TableSpec{}, false
	}
	s.specs[target] = spec
	s.snapDeletes[target] = spec.SnapshotDeletes
	return spec, true
}

// setSpec replaces target's spec (its keys learnt).
func (s *Sink) setSpec(spec TableSpec) {
	s.specMu.Lock()
	s.specs[spec.Target] = spec
	s.specMu.Unlock()
}

// snapshotDeletes reports whether target closes what a full snapshot did
// not read.
func (s *Sink) snapshotDeletes(target string) bool {
	s.specMu.Lock()
	defer s.specMu.Unlock()
	return s.snapDeletes[target]
}

// Init creates the service's own tables and every configured history table
// that declares its columns, retrying transient errors.
func (s *Sink) Init(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.withRetry(ctx, "init", "creating tables", func(ctx context.Context) error {
		if err := ensureServiceTables(ctx, s.pool, &s.cfg); err != nil {
			return err
		}
		for _, spec := range s.cfg.Tables {
			if len(spec.Keys) == 0 {
				keys, err := s.existingKeys(ctx, spec)
				if err != nil {
					return err
				}
				spec.Keys = keys
				s.setSpec(spec)
			}
			if len(spec.Columns) == 0 || len(spec.Keys) == 0 {
				continue
			}
			t, err := ensureTable(ctx, s.pool, spec, nil)
			if err != nil {
				return err
			}
			s.tables[spec.Target] = t
		}
		return nil
	})
	return err
}

// existingKeys reads the key columns of an existing history table from its
// (key columns, scd_seq) index; none when the table does not exist yet.
func (s *Sink) existingKeys(ctx context.Context, spec TableSpec) ([]string, error) {
	return KeyColumns(ctx, s.pool, spec.Schema, spec.Target)
}

// Querier is what reads the catalog: a pool, a connection or a
// transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// KeyColumns reads the key columns of the history table schema.target
// from its (key columns, scd_seq) index, in order; none when it does not
// exist.
func KeyColumns(ctx context.Context, pool Querier, schema, target string) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT a.attname FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE n.nspname = $1 AND c.relname = $2 AND a.attname <> 'scd_seq'
		ORDER BY array_position(i.indkey::int2[], a.attnum)`, schema, target+"_scd_key_seq")
	if err != nil {
		return nil, fmt.Errorf("reading the key of %s: %w", target, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// newColumns collects, per table, the columns events carry that the table
// lacks, in the order they were first met.
type newColumns struct {
	cols    []change.Column
	at      map[string]int
	guessed map[string]bool // typed by inference, not by a schema
}

func (n *newColumns) note(name, typ string, inferred bool) {
	if n.at == nil {
		n.at, n.guessed = map[string]int{}, map[string]bool{}
	}
	i, ok := n.at[name]
	if !ok {
		n.at[name] = len(n.cols)
		n.cols = append(n.cols, change.Column{Name: name, PGType: typ})
		n.guessed[name] = inferred
		return
	}
	// A schema's type beats an inferred one; an inferred text gives way
	// to a more specific inference; a schema's wider type (a table
	// created from a batch whose source widened a column) beats a
	// narrower one.
	if (!inferred && n.guessed[name]) || (inferred && n.guessed[name] && n.cols[i].PGType == "text") ||
		(!inferred && !n.guessed[name] && widens(canonicalType(n.cols[i].PGType), typ)) {
		n.cols[i].PGType = typ
		n.guessed[name] = inferred
	}
}

// prepare creates tables met for the first time and adds columns that
// events carry but their tables lack: typed and in the schema's order when
// the event has a schema, else typed by inference from the values, in name
// order. DDL runs in its own transactions.
func (s *Sink) prepare(ctx context.Context, evs []*change.Event, afters []map[string]any) error {
	extra := map[string]*newColumns{}
	widen := map[string]map[string]string{} // table → column → wider type
	failed := map[string]string{}           // table → the change schema_changes: fail stops at
	// Events written with one schema share its RowDecoder: its columns
	// are noted once per table and batch, not once per event.
	type tableSchema struct {
		table string
		row   change.RowDecoder
	}
	noted := map[tableSchema]bool{}
	if err := s.loadExisting(ctx, evs); err != nil {
		return err
	}
	var order []string
	for i, ev := range evs {
		spec, ok := s.spec(ev.Table)
		if !ok {
			continue
		}
		if len(spec.Keys) == 0 && len(ev.KeyNames) > 0 {
			spec.Keys = ev.KeyNames
			s.setSpec(spec)
		}
		if len(spec.Keys) == 0 {
			continue // no key known yet: a truncate, or dead letters to come
		}
		nc := extra[ev.Table]
		if ev.Op == change.OpTruncate && s.tables[ev.Table] == nil && nc == nil {
			// A truncate alone must still reach a table that exists.
			var exists bool
			if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
				pgx.Identifier{spec.Schema, spec.Target}.Sanitize()).Scan(&exists); err != nil {
				return fmt.Errorf("looking for table %s: %w", spec.Target, err)
			}
			if exists {
				extra[ev.Table] = &newColumns{}
				order = append(order, ev.Table)
			}
			continue
		}
		t := s.tables[ev.Table]
		note := func(name, typ string, inferred bool) {
			if t != nil {
				if i, ok := t.colIdx[pgIdent(name)]; ok {
					if !inferred && spec.FailOnSchemaChange && !holds(t.cols[i].typeName, typ) && failed[ev.Table] == "" {
						failed[ev.Table] = fmt.Sprintf("the source's column %s is now of type %s, the history table's is %s", name, typ, t.cols[i].typeName)
					}
					if !inferred && widens(t.cols[i].typeName, typ) {
						if widen[ev.Table] == nil {
							widen[ev.Table] = map[string]string{}
						}
						if prev, ok := widen[ev.Table][t.cols[i].name]; !ok || widens(canonicalType(prev), typ) {
							widen[ev.Table][t.cols[i].name] = typ
						}
					}
					return
				}
			}
			if contains(spec.IgnoreColumns, name) {
				return
			}
			if extra[ev.Table] == nil {
				extra[ev.Table] = &newColumns{}
				order = append(order, ev.Table)
			}
			extra[ev.Table].note(name, typ, inferred)
		}
		if ev.Row != nil && !noted[tableSchema{ev.Table, ev.Row}] {
			noted[tableSchema{ev.Table, ev.Row}] = true
			for _, c := range ev.Row.Columns() {
				note(c.Name, c.PGType, false)
			}
			if t != nil && spec.FailOnSchemaChange && failed[ev.Table] == "" {
				if gone := t.dropped(ev.Row.Columns()); len(gone) > 0 {
					failed[ev.Table] = fmt.Sprintf("the source no longer has column %s (dropped or renamed)", strings.Join(gone, ", "))
				}
			}
		}
		// Without a schema a column is text (DESIGN.md section 4): a value's
		// JSON form does not say whether 1 is an integer column's or a
		// numeric one's.
		if len(ev.Key) == len(spec.Keys) {
			for _, k := range spec.Keys {
				note(k, "text", true)
			}
		}
		if ev.Row == nil {
			names := make([]string, 0, len(afters[i]))
			for name := range afters[i] {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				note(name, "text", true)
			}
		}
	}
	for target, what := range failed {
		err := &DriftError{Table: s.tables[target].hist.Sanitize(), What: what +
			"; schema_changes is fail: alter the history table to match, or set schema_changes: evolve"}
		return err
	}
	targets := make([]string, 0, len(widen))
	for target := range widen {
		targets = append(targets, target)
	}
	sort.Strings(targets)
	for _, target := range targets {
		_, err := s.withRetry(ctx, "prepare", "widening columns of "+target, func(ctx context.Context) error {
			t, err := widenColumns(ctx, s, s.tables[target], widen[target])
			if err != nil {
				return err
			}
			s.tables[target] = t
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, target := range order {
		cols := extra[target].cols
		_, err := s.withRetry(ctx, "prepare", "creating table "+target, func(ctx context.Context) error {
			spec, _ := s.spec(target)
			t, err := ensureTable(ctx, s.pool, spec, cols)
			if err != nil {
				return err
			}
			s.tables[target] = t
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// loadExisting loads the tables of evs that exist but were not loaded yet
// (their columns are not declared: they are met first in a batch), so that
// the batch's schemas are compared with their columns: a type the source
// widened while the service was stopped is widened, not dead-lettered.
func (s *Sink) loadExisting(ctx context.Context, evs []*change.Event) error {
	seen := map[string]bool{}
	for _, ev := range evs {
		if s.tables[ev.Table] != nil || seen[ev.Table] {
			continue
		}
		seen[ev.Table] = true
		spec, ok := s.spec(ev.Table)
		if ok && len(spec.Keys) == 0 && len(ev.KeyNames) > 0 {
			spec.Keys = ev.KeyNames // keys from the Kafka key, as prepare takes them
			s.setSpec(spec)
		}
		if !ok || len(spec.Keys) == 0 {
			continue
		}
		_, err := s.withRetry(ctx, "prepare", "loading table "+ev.Table, func(ctx context.Context) error {
			var exists bool
			if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{spec.Schema, spec.Target}.Sanitize()).Scan(&exists); err != nil {
				return fmt.Errorf("looking for table %s: %w", spec.Target, err)
			}
			if !exists {
				return nil
			}
			t, err := ensureTable(ctx, s.pool, spec, nil)
			if err != nil {
				return err
			}
			s.tables[ev.Table] = t
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Apply folds a batch into the history tables, writes its dead letters and
// records its offsets, all in one transaction, retried as a whole on
// transient errors. A returned error means nothing of the batch was applied.
// It is Prepare followed by ApplyPrepared.
func (s *Sink) Apply(ctx context.Context, b Batch) (Result, error) {
	p, err := s.Prepare(ctx, b)
	if err != nil {
		return Result{}, err
	}
	return s.ApplyPrepared(ctx, p)
}

// Prepared is a batch ready for ApplyPrepared.
type Prepared struct {
	offsets      map[change.Partition]int64
	anchors      map[change.Partition]change.Seq
	topicIDs     map[string]string
	rewound      map[change.Partition]bool
	topicTargets map[string]string
	valid        map[change.Partition]time.Time
	confirm      func(context.Context) error
	plans        map[string]*tablePlan
	targets      []string
	dead         []DeadLetter
	early        []earlyTruncate
	// snapshots are recorded with the batch; lock are partitions locked
	// without offsets (Batch.Snapshots, Batch.Lock).
	snapshots []Snapshot
	lock      []change.Partition
	replay    map[change.Origin][]int64 // Batch.Replay
	// mismatches counts the dead letters whose value did not fit its column.
	mismatches int
}

// Prepare does the CPU-bound half of applying a batch: it creates tables and
// columns met for the first time, converts values to the column types,
// digests and groups the events. A caller may prepare the next batch while
// ApplyPrepared applies the previous one (one goroutine each); prepared
// batches must still be applied in order.
func (s *Sink) Prepare(ctx context.Context, b Batch) (*Prepared, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	afters := make([]map[string]any, len(b.Events))
	var bad []DeadLetter
	for i, ev := range b.Events {
		a, err := ev.DecodeAfter()
		if err != nil {
			bad = append(bad, eventDeadLetter(ev, err))
		}
		afters[i] = a
	}
	if err := s.prepare(ctx, b.Events, afters); err != nil {
		return nil, err
	}
	plans, dead, early, mismatches := s.plan(b.Events, afters)
	dead = append(bad, dead...)
	p := &Prepared{offsets: b.Offsets, anchors: b.Anchors, topicIDs: b.TopicIDs, rewound: b.Rewound, topicTargets: b.Targets, valid: b.LastValid, confirm: b.Confirm, plans: plans, early: early, mismatches: mismatches,
		snapshots: b.Snapshots, lock: b.Lock, replay: b.Replay,
		dead: append(append([]DeadLetter(nil), b.DeadLetters...), dead...)}
	for name := range plans {
		p.targets = append(p.targets, name)
	}
	sort.Strings(p.targets) // a fixed lock order across instances
	return p, nil
}

// ApplyPrepared applies a prepared batch; see Apply. Then it reconciles
// completed snapshots whose topics have been applied past them; a failure
// there is logged and tried again after the next batch.
func (s *Sink) ApplyPrepared(ctx context.Context, p *Prepared) (Result, error) {
	res, err := s.applyPrepared(ctx, p)
	if err == nil && s.snapshotsPending && !s.reconciling {
		s.reconciling = true
		if rerr := s.reconcile(ctx); rerr != nil {
			s.log.Warn("snapshot reconciliation failed; trying again after the next batch", zap.Error(rerr))
		}
		s.reconciling = false
	}
	return res, err
}

func (s *Sink) applyPrepared(ctx context.Context, p *Prepared) (Result, error) {
	plans, dead, targets, offsets := p.plans, p.dead, p.targets, p.offsets
	var gen uint64
	var res Result
	var ops *cacheOps
	// A value PostgreSQL rejects fails the whole batch; the batch is then
	// applied again isolating the events that carry such values.
	isolate := false
	attempt := func(ctx context.Context) error {
		res, ops = Result{}, &cacheOps{}
		gen = s.forgetNow() // a Forget during the retries counts too
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			registerTypes(tx.Conn().TypeMap())
			if _, err := tx.Exec(ctx, keyedPlans); err != nil {
				return fmt.Errorf("setting the batch's planner options: %w", err)
			}
			if err := s.fence(ctx, tx, offsets, p.lock); err != nil {
				return err
			}
			for _, e := range p.early {
				if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.scd2sink_truncates (target, scd_seq, valid_from) VALUES ($1, $2, $3)
					ON CONFLICT DO NOTHING`, pgx.Identifier{s.cfg.Schema}.Sanitize()), e.target, []byte(e.seq), e.at); err != nil {
					return fmt.Errorf("recording truncate of %s: %w", e.target, err)
				}
			}
			if err := s.markReplayed(ctx, tx, p.replay); err != nil {
				return err
			}
			allDead := dead
			for _, name := range targets {
				apply := s.applyTable
				if isolate {
					apply = s.applyIsolating
				}
				r, d, err := s.applyKeyChanges(ctx, tx, plans[name], ops, apply)
				if err != nil {
					return fmt.Errorf("applying batch to %s: %w", name, err)
				}
				res.add(r)
				allDead = append(allDead, d...)
			}
			newDead, err := s.failedAgain(ctx, tx, p.replay, allDead)
			if err != nil {
				return err
			}
			if err := s.writeDeadLetters(ctx, tx, newDead); err != nil {
				return err
			}
			if err := s.recordSnapshots(ctx, tx, p.snapshots); err != nil {
				return err
			}
			res.DeadLetters = len(allDead)
			if err := s.writeOffsets(ctx, tx, offsets, p); err != nil {
				return err
			}
			if p.confirm != nil {
				return p.confirm(ctx)
			}
			return nil
		})
	}
	retries, err := s.withRetry(ctx, "apply", "applying batch", attempt)
	if err != nil && isDataError(err) {
		s.log.Warn("a value was rejected by PostgreSQL; applying the batch again without it", zap.Error(err))
		isolate = true
		var more int
		more, err = s.withRetry(ctx, "apply", "applying batch", attempt)
		retries += more
	}
	res.Retries = retries
	res.TypeMismatches = p.mismatches
	if err != nil {
		s.cache.reset()
		return res, err
	}
	if s.forgetNow() != gen {
		return res, nil // forgotten while it was applied: keep nothing of it
	}
	if isolate {
		s.cache.reset() // savepoints rolled back what ops recorded
	} else {
		s.cache.apply(ops)
	}
	for part, o := range offsets {
		s.written[part] = o
	}
	return res, nil
}

// keyedPlans makes the batch transaction's statements probe the history
// tables' key indexes. They join a batch's keys (unnest of arrays, which
// the planner guesses at 10 rows) with a history table; with stale
// statistics the planner otherwise hash-joins them with a sequential scan
// of the whole table, once per statement and batch (seen in
// BenchmarkPipeline: the Type 1 update of older versions, matched on the
// key alone). Scoped to the transaction.
const keyedPlans = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
	set_config('enable_mergejoin', 'off', true)`

// Forget empties the Sink's memory of what it wrote. The consumer calls it
// when partitions are assigned, revoked or lost; it is safe to call from
// any goroutine, a batch being applied meanwhile included (its memory is
// then not kept either). It never waits.
func (s *Sink) Forget() { s.forgets.Add(1) }

// forgetNow acts on Forget calls made since the last look (called by the
// applying goroutine) and returns the count acted on.
func (s *Sink) forgetNow() uint64 {
	if g := s.forgets.Load(); g != s.forgot {
		s.cache.reset()
		s.written = map[change.Partition]int64{}
		s.forgot = g
	}
	return s.forgot
}

// fence serialises writers of the batch's partitions (a transaction-scoped
// advisory lock per partition, taken in a fixed order) and empties the
// cache if another writer applied one of them since this Sink did.
func (s *Sink) fence(ctx context.Context, tx pgx.Tx, offsets map[change.Partition]int64, lock []change.Partition) error {
	if len(offsets) == 0 && len(lock) == 0 {
		return nil
	}
	parts := make([]change.Partition, 0, len(offsets)+len(lock))
	for p := range offsets {
		parts = append(parts, p)
	}
	for _, p := range lock {
		if _, ok := offsets[p]; !ok {
			parts = append(parts, p)
		}
	}
	sort.Slice(parts, func(i, j int) bool {
		if parts[i].Topic != parts[j].Topic {
			return parts[i].Topic < parts[j].Topic
		}
		return parts[i].Partition < parts[j].Partition
	})
	locks := make([]int64, len(parts))
	topics := make([]string, len(parts))
	nums := make([]int32, len(parts))
	for i, p := range parts {
		h := fnv.New64a()
		fmt.Fprintf(h, "scd2sink\x00%s\x00%s\x00%d", s.cfg.ConsumerGroup, p.Topic, p.Partition)
		locks[i] = int64(h.Sum64())
		topics[i], nums[i] = p.Topic, p.Partition
	}
	if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT k FROM unnest($1::bigint[]) WITH ORDINALITY AS x(k, o) ORDER BY o) l`, locks); err != nil {
		return fmt.Errorf("locking partitions: %w", err)
	}
	// With the offsets, the number of reconciled snapshots: a new one
	// closed keys behind every writer's back (reconcile.go).
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT o.topic, o.partition, o.next_offset, g.n
		FROM (SELECT (SELECT count(*) FROM %[1]s.scd2sink_snapshots WHERE consumer_group = $1 AND done_at IS NOT NULL)
			+ coalesce((SELECT n FROM %[1]s.scd2sink_outside_writes WHERE consumer_group = $1), 0) AS n) g
		LEFT JOIN (%[1]s.scd2sink_offsets o JOIN unnest($2::text[], $3::int[]) AS x(t, p) ON o.topic = x.t AND o.partition = x.p)
		ON o.consumer_group = $1`,
		pgx.Identifier{s.cfg.Schema}.Sanitize()), s.cfg.ConsumerGroup, topics, nums)
	if err != nil {
		return fmt.Errorf("reading scd2sink_offsets: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var topic *string
		var part *int32
		var off *int64
		var reconciled int64
		if err := rows.Scan(&topic, &part, &off, &reconciled); err != nil {
			return err
		}
		if reconciled != s.reconciled {
			if s.reconciled >= 0 {
				s.cache.reset()
			}
			s.reconciled = reconciled
		}
		if topic == nil {
			continue // no offsets recorded yet
		}
		p := change.Partition{Topic: *topic, Partition: *part}
		if w, ok := s.written[p]; !ok || w != *off {
			s.cache.reset()
		}
	}
	return rows.Err()
}

func (s *Sink) writeDeadLetters(ctx context.Context, tx pgx.Tx, dead []DeadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	rows := make([][]any, len(dead))
	now := time.Now()
	for i, d := range dead {
		var hdrs []byte
		if len(d.Headers) > 0 {
			hs := make([]Header, len(d.Headers))
			for i, h := range d.Headers {
				// jsonb refuses \u0000: a NUL in a key is written as \0.
				hs[i] = Header{Key: strings.ReplaceAll(h.Key, "\x00", `\0`), Value: h.Value}
			}
			hdrs, _ = json.Marshal(hs) // strings and bytes: cannot fail
		}
		rows[i] = []any{d.Origin.Topic, d.Origin.Partition.Partition, d.Origin.Offset, d.Table, d.Key, d.Value, cleanText(d.Err), now, hdrs, d.Decoded}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{s.cfg.Schema, s.cfg.DeadLetterTable},
		[]string{"topic", "partition", "offset", "target", "key", "value", "error", "created_at", "headers", "decoded"}, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("writing %d dead letters: %w", len(dead), err)
	}
	return nil
}

// writeOffsets records the batch's offsets. They never move backwards
// for one topic ID: only a topic re-created under the same name (another
// ID), or a partition rewound on purpose, replaces a higher offset.
func (s *Sink) writeOffsets(ctx context.Context, tx pgx.Tx, offsets map[change.Partition]int64, pr *Prepared) error {
	if len(offsets) == 0 {
		return nil
	}
	anchors, ids, rewound := pr.anchors, pr.topicIDs, pr.rewound
	var topics, tids, targets []string
	var parts []int32
	var offs []int64
	var anch [][]byte
	var back []bool
	var valid []*time.Time
	for p, o := range offsets {
		topics, parts, offs = append(topics, p.Topic), append(parts, p.Partition), append(offs, o)
		anch, tids, back = append(anch, anchors[p]), append(tids, ids[p.Topic]), append(back, rewound[p])
		targets = append(targets, pr.topicTargets[p.Topic])
		if v, ok := pr.valid[p]; ok {
			valid = append(valid, &v)
		} else {
			valid = append(valid, nil)
		}
	}
	q := fmt.Sprintf(`INSERT INTO %[1]s.scd2sink_offsets AS o (consumer_group, topic, partition, next_offset, anchor_seq, topic_id, target, last_valid_from, updated_at)
		SELECT $1, t, p, n, a, nullif(i, ''), nullif(g, ''), CASE WHEN v IS NOT NULL THEN least(v, now()) END, now()
		FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bytea[], $6::text[], $7::text[], $8::timestamptz[]) AS x(t, p, n, a, i, g, v)
		ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET
			target = coalesce(excluded.target, o.target),
			last_valid_from = CASE WHEN excluded.topic_id IS DISTINCT FROM o.topic_id AND excluded.topic_id IS NOT NULL AND o.topic_id IS NOT NULL
				THEN excluded.last_valid_from
				WHEN o.last_valid_from IS NULL OR excluded.last_valid_from > o.last_valid_from
				THEN coalesce(excluded.last_valid_from, o.last_valid_from) ELSE o.last_valid_from END,
			next_offset = CASE WHEN excluded.topic_id IS DISTINCT FROM o.topic_id AND excluded.topic_id IS NOT NULL AND o.topic_id IS NOT NULL
				THEN excluded.next_offset ELSE greatest(o.next_offset, excluded.next_offset) END,
			anchor_seq = CASE WHEN excluded.topic_id IS DISTINCT FROM o.topic_id AND excluded.topic_id IS NOT NULL AND o.topic_id IS NOT NULL
				THEN excluded.anchor_seq ELSE coalesce(excluded.anchor_seq, o.anchor_seq) END,
			topic_id = coalesce(excluded.topic_id, o.topic_id), updated_at = now()`,
		pgx.Identifier{s.cfg.Schema}.Sanitize())
	if _, err := tx.Exec(ctx, q, s.cfg.ConsumerGroup, topics, parts, offs, anch, tids, targets, valid); err != nil {
		return fmt.Errorf("recording offsets: %w", err)
	}
	if !slices.Contains(back, true) {
		return nil
	}
	// Partitions rewound on purpose: the new offset replaces the old.
	q = fmt.Sprintf(`UPDATE %[1]s.scd2sink_offsets AS o SET next_offset = x.n, anchor_seq = coalesce(x.a, o.anchor_seq), updated_at = now()
		FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bytea[], $6::bool[]) AS x(t, p, n, a, r)
		WHERE x.r AND o.consumer_group = $1 AND o.topic = x.t AND o.partition = x.p`, pgx.Identifier{s.cfg.Schema}.Sanitize())
	if _, err := tx.Exec(ctx, q, s.cfg.ConsumerGroup, topics, parts, offs, anch, back); err != nil {
		return fmt.Errorf("recording rewound offsets: %w", err)
	}
	return nil
}

// Rewind lowers the offsets recorded for the configured consumer group to
// the given ones, where they are higher: partitions placed back on purpose
// because the log they were read from was truncated. Anchors are kept (the
// highest sequence below the old offset bounds the one below the new).
func (s *Sink) Rewind(ctx context.Context, to map[change.Partition]int64) error {
	var topics []string
	var parts []int32
	var offs []int64
	for p, o := range to {
		topics, parts, offs = append(topics, p.Topic), append(parts, p.Partition), append(offs, o)
	}
	_, err := s.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.scd2sink_offsets AS o SET next_offset = x.n, updated_at = now()
		FROM unnest($2::text[], $3::int[], $4::bigint[]) AS x(t, p, n)
		WHERE o.consumer_group = $1 AND o.topic = x.t AND o.partition = x.p AND o.next_offset > x.n`,
		pgx.Identifier{s.cfg.Schema}.Sanitize()), s.cfg.ConsumerGroup, topics, parts, offs)
	if err != nil {
		return fmt.Errorf("rewinding offsets: %w", err)
	}
	return nil
}

// TopicIDs returns the Kafka topic ID recorded with each partition's
// offsets for the configured consumer group (partitions recorded without
// one are missing).
func (s *Sink) TopicIDs(ctx context.Context) (map[change.Partition]string, error) {
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT topic, partition, topic_id FROM %s.scd2sink_offsets
		WHERE consumer_group = $1 AND topic_id IS NOT NULL`,
		pgx.Identifier{s.cfg.Schema}.Sanitize()), s.cfg.ConsumerGroup)
	if err != nil {
		return nil, fmt.Errorf("reading scd2sink_offsets: %w", err)
	}
	defer rows.Close()
	out := map[change.Partition]string{}
	for rows.Next() {
		var p change.Partition
		var id string
		if err := rows.Scan(&p.Topic, &p.Partition, &id); err != nil {
			return nil, err
		}
		out[p] = id
	}
	return out, rows.Err()
}

// Anchors returns, per partition of the configured consumer group, the
// highest sequence of the records below its recorded offset: what a
// consumer resuming there anchors a snapshot read without a sequence to.
func (s *Sink) Anchors(ctx context.Context) (map[change.Partition]change.Seq, error) {
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT topic, partition, anchor_seq FROM %s.scd2sink_offsets WHERE consumer_group = $1 AND anchor_seq IS NOT NULL`,
		pgx.Identifier{s.cfg.Schema}.Sanitize()), s.cfg.ConsumerGroup)
	if err != nil {
		return nil, fmt.Errorf("reading scd2sink_offsets: %w", err)
	}
	defer rows.Close()
	out := map[change.Partition]change.Seq{}
	for rows.Next() {
		var p change.Partition
		var a []byte
		if err := rows.Scan(&p.Topic, &p.Partition, &a); err != nil {
			return nil, err
		}
		out[p] = a
	}
	return out, rows.Err()
}

// Offsets returns the offsets recorded in scd2sink_offsets for the
// configured consumer group: the next offset to consume per partition.
func (s *Sink) Offsets(ctx context.Context) (map[change.Partition]int64, error) {
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT topic, partition, next_offset FROM %s.scd2sink_offsets WHERE consumer_group = $1`,
		pgx.Identifier{s.cfg.Schema}.Sanitize()), s.cfg.ConsumerGroup)
	if err != nil {
		return nil, fmt.Errorf("reading scd2sink_offsets: %w", err)
	}
	defer rows.Close()
	out := map[change.Partition]int64{}
	for rows.Next() {
		var p change.Partition
		var o int64
		if err := rows.Scan(&p.Topic, &p.Partition, &o); err != nil {
			return nil, err
		}
		out[p] = o
	}
	return out, rows.Err()
}
