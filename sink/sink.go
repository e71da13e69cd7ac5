package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/pgcodec"
	"github.com/scd2sink/scd2sink/sink/statecache"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"go.uber.org/zap"
)

// Sink applies batches of change events to SCD2 history tables. Apply (or
// ApplyPrepared) is called from one goroutine at a time, in the order the
// batches' offsets were released; Prepare may run beside it. A batch may
// be applied in parts side by side (Config.ApplyWorkers, parallel.go).
type Sink struct {
	mu   sync.Mutex // guards tables against Prepare running beside Init
	cfg  Config
	pool *pgxpool.Pool
	log  *zap.Logger
	// plainWarned holds the targets warned about by warnPlain.
	plainWarned sync.Map
	conv        converter
	// specs (guarded by specMu) are the known targets' specs: the
	// configured ones and those cfg.Resolve gave.
	specMu sync.Mutex
	specs  map[string]TableSpec
	tables map[string]*table
	cache  *statecache.Cache
	// written is the offset this Sink last recorded per partition; another
	// value in scd2sink_offsets means another writer applied that partition.
	written map[change.Partition]int64
	// seen is, for partitions of resized topics this Sink does not write,
	// the offset the fence last saw; resized are the topics its fences
	// found resized (resize.go; both under amu).
	seen    map[change.Partition]int64
	resized map[string]bool
	// forgets counts Forget calls; forgot is the count the applying
	// goroutines last acted on. Forget may be called from a rebalance
	// callback while a batch is still being applied (one abandoned after
	// the revoke budget): it only bumps the count, and the applying
	// goroutines, the only ones touching cache and written (under amu),
	// empty them.
	forgets atomic.Uint64
	forgot  uint64
	// amu guards cache, written, forgot and reconciled while the parts of
	// a batch are applied side by side (parallel.go).
	amu sync.Mutex
	// snapshotsPending: scd2sink_snapshots may hold snapshots to reconcile;
	// reconciling guards against reconciling from reconciliation's own
	// batches (reconcile.go). reconciled is the count of reconciled
	// snapshots the fence last saw (-1: none seen yet).
	// snapshotsPending is set by any goroutine recording a snapshot (a
	// probe applies beside the batches, park.go); snapshotsRecorded counts
	// those records, so that a reconciliation that began before one does
	// not clear the flag.
	snapshotsPending  atomic.Bool
	snapshotsRecorded atomic.Int64
	reconciling       bool
	// notBefore is, by target and sequence, when this Sink looks at a
	// snapshot again: a re-run for late events, or one another instance
	// holds (reconcile.go). An entry goes once its time has passed.
	notBefore  map[string]time.Time
	reconciled int64
	// skipReconcile, when set, names targets whose snapshots wait (the
	// consumer's parked targets: their tables are in trouble).
	skipReconcile func(target string) bool
	// reconcileWarned is when a failed reconciliation was last logged.
	reconcileWarned time.Time
	// has is plan's scratch: the columns an image carries (under mu).
	has []bool
	// boxes holds the values plan decodes into the rows of a batch
	// (under mu); they die with the batch (the cache packs or detaches
	// what it keeps).
	boxes change.Boxes
	// pending and owners: plan's scratch (under mu), emptied after use.
	pending []fold.Event
	owners  []*keyPlan
	// fill and fillPut: toFevent's scratch (under mu).
	fill    rowFill
	fillPut func(name string, raw any) error
	// parts is how many parts a batch may be applied in (parallel.go).
	parts int
	// snapDeletes are the targets with SnapshotDeletes (guarded by specMu).
	snapDeletes map[string]bool
	// erased holds the erased key hashes per table (under emu);
	// erasureStale asks the next batch to read them again (erasure.go).
	emu          sync.Mutex
	erased       map[string]map[string]bool
	erasureStale atomic.Bool
}

// New validates cfg and returns a Sink writing through pool. Call Init before
// the first Apply.
func New(cfg Config, pool *pgxpool.Pool) (*Sink, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Sink{cfg: cfg, pool: pool, log: cfg.Logger, conv: converter{m: pgtype.NewMap()},
		specs: map[string]TableSpec{}, tables: map[string]*table{},
		cache: statecache.New(cfg.CacheKeys, cfg.CacheBytes), written: map[change.Partition]int64{}, seen: map[change.Partition]int64{}, resized: map[string]bool{},
		reconciled: -1}
	s.snapshotsPending.Store(true)
	// Parts of a batch applied side by side (parallel.go), each on its own
	// connection: Prepare and the consumer's bookkeeping need two more.
	s.parts = max(1, cfg.ApplyWorkers)
	if pool != nil {
		s.parts = min(s.parts, max(1, int(pool.Config().MaxConns)-2))
	}
	s.snapDeletes = map[string]bool{}
	for _, t := range cfg.Tables {
		s.specs[t.Target] = t
		s.snapDeletes[t.Target] = t.SnapshotDeletes
	}
	s.erasureStale.Store(true)
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
			s.warnPlain(t)
			s.tables[spec.Target] = t
		}
		// A writer that could not recognise erased keys must not start.
		s.emu.Lock()
		defer s.emu.Unlock()
		return s.loadErasures(ctx, s.pool)
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
// from its (key columns, scd_seq) index (a partitioned table's: key
// columns, scd_seq, is_current, valid_to), in order; none when it does not
// exist.
func KeyColumns(ctx context.Context, pool Querier, schema, target string) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT a.attname FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE n.nspname = $1 AND c.relname = $2
		ORDER BY array_position(i.indkey::int2[], a.attnum)`, schema, target+"_scd_key_seq")
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
	// Names that PostgreSQL cuts to the same 63 bytes are one column (the
	// first met); events carrying both are dead-lettered (plan.go).
	i, ok := n.at[catalog.Ident(name)]
	if !ok {
		n.at[catalog.Ident(name)] = len(n.cols)
		n.cols = append(n.cols, change.Column{Name: name, PGType: typ})
		n.guessed[name] = inferred
		return
	}
	// A schema's type beats an inferred one; an inferred text gives way
	// to a more specific inference; a schema's wider type (a table
	// created from a batch whose source widened a column) beats a
	// narrower one.
	if (!inferred && n.guessed[name]) || (inferred && n.guessed[name] && n.cols[i].PGType == "text") ||
		(!inferred && !n.guessed[name] && catalog.Widens(catalog.CanonicalType(n.cols[i].PGType), typ)) {
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
				if i, ok := t.Index[catalog.Ident(name)]; ok {
					if !inferred && spec.FailOnSchemaChange && !catalog.Holds(t.Cols[i].TypeName, typ) && failed[ev.Table] == "" {
						failed[ev.Table] = fmt.Sprintf("the source's column %s is now of type %s, the history table's is %s", name, typ, t.Cols[i].TypeName)
					}
					if !inferred && catalog.Widens(t.Cols[i].TypeName, typ) {
						if widen[ev.Table] == nil {
							widen[ev.Table] = map[string]string{}
						}
						if prev, ok := widen[ev.Table][t.Cols[i].Name]; !ok || catalog.Widens(catalog.CanonicalType(prev), typ) {
							widen[ev.Table][t.Cols[i].Name] = typ
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
			// A complete image (a document) lacks the fields it does not
			// have: that is no drop.
			if t != nil && spec.FailOnSchemaChange && failed[ev.Table] == "" && !ev.Complete {
				if gone := t.Dropped(ev.Row.Columns()); len(gone) > 0 {
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
		if ev.Row == nil && afters[i] == nil && ev.Op.HasAfter() && ev.CanVisitAfter() {
			// An image plan visits without a map: its names alone.
			all := t != nil
			if all {
				ev.VisitAfterNames(func(name string) bool {
					all = t.Has(name, spec.IgnoreColumns)
					return all
				})
			}
			if !all { // most often it has them: noting them would change nothing
				var names []string
				ev.VisitAfterNames(func(name string) bool {
					if !slices.Contains(names, name) {
						names = append(names, name)
					}
					return true
				})
				sort.Strings(names)
				for _, name := range names {
					note(name, "text", true)
				}
			}
		} else if ev.Row == nil && (t == nil || !t.HasAll(afters[i], spec.IgnoreColumns)) { // most often it has them: noting them would change nothing
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
		return &TargetError{Target: target, Err: &DriftError{Table: s.tables[target].Hist.Sanitize(), What: what +
			"; schema_changes is fail: alter the history table to match, or set schema_changes: evolve"}}
	}
	targets := make([]string, 0, len(widen))
	for target := range widen {
		targets = append(targets, target)
	}
	sort.Strings(targets)
	for _, target := range targets {
		old := s.tables[target]
		var t *table
		_, err := s.withRetry(ctx, "prepare", "widening columns of "+target, func(ctx context.Context) (err error) {
			s.unlocked(func() { t, err = widenColumns(ctx, s, old, widen[target]) })
			return targetErr(target, err)
		})
		if err != nil {
			return targetErr(target, err)
		}
		s.tables[target] = t
	}
	for _, target := range order {
		cols := extra[target].cols
		spec, _ := s.spec(target)
		var t *table
		_, err := s.withRetry(ctx, "prepare", "creating table "+target, func(ctx context.Context) (err error) {
			s.unlocked(func() { t, err = ensureTable(ctx, s.pool, spec, cols) })
			return targetErr(target, err)
		})
		if err != nil {
			return targetErr(target, err)
		}
		s.warnPlain(t)
		s.tables[target] = t
	}
	return nil
}

// targetErr makes err, of one target's DDL, a TargetError (nil stays
// nil): inside withRetry too, so that a lock or statement timeout is not
// retried there, on the loop that prepares every table's batches, but
// parks the target at once (ParkTarget).
func targetErr(target string, err error) error {
	var te *TargetError
	if err == nil || errors.As(err, &te) {
		return err
	}
	return &TargetError{Target: target, Err: err}
}

// unlocked runs fn, a statement on a table's DDL, without s.mu, which
// Prepare holds: DDL may wait for its lock up to lock_timeout, and one
// table's wait (a parked table's probe, consumer/park.go) must not stall
// the batches of the others. fn touches no state s.mu guards; its result
// is stored after, under s.mu. Two goroutines preparing one table meanwhile
// run the same idempotent DDL.
func (s *Sink) unlocked(fn func()) {
	s.mu.Unlock()
	defer s.mu.Lock()
	fn()
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
		var t *table
		_, err := s.withRetry(ctx, "prepare", "loading table "+ev.Table, func(ctx context.Context) (err error) {
			s.unlocked(func() {
				var exists bool
				if err = s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{spec.Schema, spec.Target}.Sanitize()).Scan(&exists); err != nil {
					err = fmt.Errorf("looking for table %s: %w", spec.Target, err)
					return
				}
				if exists {
					t, err = ensureTable(ctx, s.pool, spec, nil)
				}
			})
			return targetErr(ev.Table, err)
		})
		if err != nil {
			return targetErr(ev.Table, err)
		}
		if t != nil && s.tables[ev.Table] == nil {
			s.tables[ev.Table] = t
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
// records its offsets, in one transaction, or in one per part when it is
// applied in parts (parallel.go), retried on transient errors. A returned
// error means nothing of the batch was applied, or, applied in parts,
// that some parts committed (their offsets recorded with them) and the
// others did not; ApplyPrepared again with the same Prepared applies the
// rest. It is Prepare followed by ApplyPrepared.
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
	outside   bool                      // Batch.Outside
	// mismatches counts the dead letters whose value did not fit its column.
	mismatches int
	// parts are the batch's parts applied side by side (nil: applied
	// whole), cut once (cut); committed marks a part that committed
	// (parallel.go).
	cut       bool
	parts     []*Prepared
	committed bool
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
		if ev.CanVisitAfter() && ev.Op.HasAfter() {
			continue // decoded in plan, straight into its row
		}
		a, err := ev.DecodeAfter()
		if err != nil {
			bad = append(bad, eventDeadLetter(ev, ReasonInvalid, err))
		}
		afters[i] = a
	}
	if err := s.prepare(ctx, b.Events, afters); err != nil {
		return nil, err
	}
	plans, dead, early, mismatches := s.plan(b.Events, afters)
	dead = append(bad, dead...)
	p := &Prepared{offsets: b.Offsets, anchors: b.Anchors, topicIDs: b.TopicIDs, rewound: b.Rewound, topicTargets: b.Targets, valid: b.LastValid, confirm: b.Confirm, plans: plans, early: early, mismatches: mismatches,
		snapshots: b.Snapshots, lock: b.Lock, replay: b.Replay, outside: b.Outside,
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
	if err == nil && s.snapshotsPending.Load() && !s.reconciling {
		s.reconciling = true
		if rerr := s.reconcile(ctx); rerr != nil && time.Since(s.reconcileWarned) > time.Minute {
			s.reconcileWarned = time.Now()
			s.log.Warn("snapshot reconciliation failed; trying again after the next batch (logged at most once a minute)", zap.Error(rerr))
		}
		s.reconciling = false
	}
	return res, err
}

// Reconcile decides every recorded snapshot whose topic has been applied
// past it (reconciled, or held by the guard), whoever recorded it: the
// consumer calls it about once a second while it has nothing to apply, so
// that a snapshot recorded by another member, or whose topic's partitions
// all went quiet, is not left waiting for a batch that never comes
// (DESIGN.md section 5). Called from the goroutine that applies batches;
// without a table that closes what snapshots did not read it does nothing.
func (s *Sink) Reconcile(ctx context.Context) error {
	if s.reconciling || !s.anySnapshotDeletes() {
		return nil
	}
	s.reconciling = true
	defer func() { s.reconciling = false }()
	return s.reconcile(ctx)
}

// SkipReconcile makes reconciliation leave the snapshots of the targets
// skip names waiting (the consumer's parked targets). Call it before the
// first batch.
func (s *Sink) SkipReconcile(skip func(target string) bool) { s.skipReconcile = skip }

// anySnapshotDeletes reports whether a known target closes what a full
// snapshot did not read.
func (s *Sink) anySnapshotDeletes() bool {
	s.specMu.Lock()
	defer s.specMu.Unlock()
	for _, on := range s.snapDeletes {
		if on {
			return true
		}
	}
	return false
}

// applyOne applies a prepared batch, or one part of it (parallel.go), in
// one transaction.
func (s *Sink) applyOne(ctx context.Context, p *Prepared) (Result, error) {
	plans, dead, targets, offsets := p.plans, p.dead, p.targets, p.offsets
	var gen uint64
	var seen int64
	var res Result
	var ops *cacheOps
	// A value PostgreSQL rejects fails the whole batch; the batch is then
	// applied again isolating the events that carry such values.
	isolate := false
	attempt := func(ctx context.Context) error {
		res, ops = Result{}, &cacheOps{Ops: statecache.Ops{Off: isolate || s.cache.Limit() <= 0}}
		gen = s.forgetNow() // a Forget during the retries counts too
		return pgx.BeginTxFunc(ctx, s.pool, applyTx, func(tx pgx.Tx) error {
			pgcodec.Register(tx.Conn().TypeMap())
			if err := s.fence(ctx, tx, offsets, p.lock); err != nil {
				return err
			}
			s.amu.Lock()
			seen = s.reconciled // what this transaction's fence saw
			s.amu.Unlock()
			for _, e := range p.early {
				if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.scd2sink_truncates (target, scd_seq, valid_from) VALUES ($1, $2, $3)
					ON CONFLICT DO NOTHING`, pgx.Identifier{s.cfg.Schema}.Sanitize()), e.target, []byte(e.seq), e.at); err != nil {
					return fmt.Errorf("recording truncate of %s: %w", e.target, err)
				}
			}
			if err := s.markReplayed(ctx, tx, p.replay); err != nil {
				return err
			}
			if len(offsets) == 0 && len(p.lock) == 0 {
				s.erasureStale.Store(true) // no fence read the outside-writes count
			}
			erased, dead, err := s.dropErased(ctx, tx, p, dead)
			if err != nil {
				return err
			}
			res.Erased = erased
			if p.outside {
				if err := s.countOutsideWrite(ctx, tx); err != nil {
					return err
				}
			}
			if !isolate {
				if ops.pre, err = s.prefetch(ctx, tx, plans, targets); err != nil {
					return err
				}
			}
			allDead := dead
			for _, name := range targets {
				apply := s.applyTable
				if isolate {
					apply = s.applyIsolating
				}
				r, d, err := s.applyKeyChanges(ctx, tx, plans[name], ops, apply)
				if err == nil && r.VersionsOpened > 0 && s.snapshotDeletes(name) {
					err = s.noteLate(ctx, tx, plans[name])
				}
				if err != nil {
					return &TargetError{Target: name, Err: fmt.Errorf("applying batch to %s: %w", name, err)}
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
			res.Dead = make([]DeadNote, len(allDead))
			for i, d := range allDead {
				reason := d.Reason
				if reason == "" {
					reason = ReasonDecode
				}
				res.Dead[i] = DeadNote{Origin: d.Origin, Table: d.Table, Reason: reason, Err: d.Err}
			}
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
	for tries := 0; tries < 3; tries++ {
		var grown *errTopicGrown
		if !errors.As(err, &grown) {
			break
		}
		// Partitions were added and no assignment recorded it: record it
		// (waiting for the writers under the old count), then apply.
		if _, nerr := s.NotePartitions(ctx, grown.counts()); nerr != nil {
			err = fmt.Errorf("%v: %w", grown, nerr)
			break
		}
		var more int
		more, err = s.withRetry(ctx, "apply", "applying batch", attempt)
		retries += more
	}
	if err != nil && isDataError(err) {
		s.log.Warn("a value was rejected by PostgreSQL; applying the batch again without it", zap.Error(err))
		isolate = true
		var more int
		more, err = s.withRetry(ctx, "apply", "applying batch", attempt)
		retries += more
	}
	res.Retries = retries
	res.TypeMismatches = p.mismatches
	s.amu.Lock()
	defer s.amu.Unlock()
	if err != nil {
		s.cache.Reset()
		return Result{Retries: res.Retries}, err // nothing of it committed
	}
	if len(p.snapshots) > 0 {
		// Committed: a reconciliation that starts from here sees them
		// (recordSnapshots bumped the count too, before the commit).
		s.snapshotsRecorded.Add(1)
		s.snapshotsPending.Store(true)
	}
	if s.forgetLocked() != gen {
		return res, nil // forgotten while it was applied: keep nothing of it
	}
	if isolate || s.reconciled != seen {
		// Savepoints rolled back what ops recorded; or another part's
		// fence saw a reconciliation that committed after this one's.
		s.cache.Reset()
	} else {
		s.cache.Apply(&ops.Ops)
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

// applyTx is a batch's transaction: READ COMMITTED whatever the server's
// default, so that each statement sees what committed before it and took
// its locks (the column types read after a table's lock, prefetch.go; the
// offsets read after the partitions' advisory locks, fence).
var applyTx = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// Forget empties the Sink's memory of what it wrote. The consumer calls it
// when partitions are assigned, revoked or lost; it is safe to call from
// any goroutine, a batch being applied meanwhile included (its memory is
// then not kept either). It never waits.
func (s *Sink) Forget() { s.forgets.Add(1) }

// forgetNow acts on Forget calls made since the last look (called by the
// applying goroutines) and returns the count acted on.
func (s *Sink) forgetNow() uint64 {
	s.amu.Lock()
	defer s.amu.Unlock()
	return s.forgetLocked()
}

// forgetLocked is forgetNow with amu held.
func (s *Sink) forgetLocked() uint64 {
	if g := s.forgets.Load(); g != s.forgot {
		s.cache.Reset()
		s.written = map[change.Partition]int64{}
		s.seen = map[change.Partition]int64{}
		s.forgot = g
	}
	return s.forgot
}
