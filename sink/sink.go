package sink

import (
	"context"
	"sync"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/maint"
	"github.com/scd2sink/scd2sink/sink/plan"

	"github.com/jackc/pgx/v5/pgxpool"
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
	// specs (guarded by specMu) are the known targets' specs: the
	// configured ones and those cfg.Resolve gave.
	specMu sync.Mutex
	specs  map[string]TableSpec
	tables map[string]*plan.Table
	// mem is what the Sink remembers of what it wrote (memory.go).
	mem *memory
	// recon decides completed full snapshots (reconcile.go).
	recon *reconciler
	// planner turns batches into plans (plan.go), under mu.
	planner plan.Planner
	// parts is how many parts a batch may be applied in (parallel.go).
	parts int
	// snapDeletes are the targets with SnapshotDeletes (guarded by specMu).
	snapDeletes map[string]bool
	// erasures knows the erased keys (erasure.go).
	erasures *erasures
	// tune holds sizes and hooks (tuning.go; tests change them before
	// the first batch); stats counts the ways batches took.
	tune  tuning
	stats counters
	// maint is the history's upkeep (package maint, upkeep.go).
	maint *maint.Maint
}

// New validates cfg and returns a Sink writing through pool. Call Init before
// the first Apply.
func New(cfg Config, pool *pgxpool.Pool) (*Sink, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Sink{cfg: cfg, pool: pool, log: cfg.Logger, planner: plan.NewPlanner(), specs: map[string]TableSpec{}, tables: map[string]*plan.Table{},
		mem: newMemory(cfg.CacheKeys, cfg.CacheBytes), tune: defaultTuning()}
	s.recon = &reconciler{s: s}
	s.recon.pending.Store(true)
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
	s.erasures = &erasures{schema: cfg.Schema, secret: cfg.ErasureSecret, alias: cfg.ErasureAlias, decodeKey: cfg.DecodeKey,
		spec: s.spec, kconv: plan.NewConverter()}
	s.erasures.stale.Store(true)
	s.maint = maint.New(maint.Config{Schema: cfg.Schema, ConsumerGroup: cfg.ConsumerGroup, Patterns: cfg.Resolve != nil,
		Logger: cfg.Logger, Retry: s.withRetry, Tuning: &s.tune.Tuning}, pool, upkeepView{s})
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
	err := s.once(ctx, func(ctx context.Context) error {
		if err := catalog.EnsureService(ctx, s.pool, catalog.Service{Schema: s.cfg.Schema, DeadLetterTable: s.cfg.DeadLetterTable,
			ReorderWindow: s.cfg.ReorderWindow, Logger: s.log}); err != nil {
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
		s.erasures.mu.Lock()
		defer s.erasures.mu.Unlock()
		return s.erasures.load(ctx, s.pool)
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
type Querier = catalog.Querier

// KeyColumns reads the key columns of the history table schema.target
// (catalog.KeyColumns); none when it does not exist.
func KeyColumns(ctx context.Context, q Querier, schema, target string) ([]string, error) {
	return catalog.KeyColumns(ctx, q, schema, target)
}

// Forget empties the Sink's memory of what it wrote. The consumer calls it
// when partitions are assigned, revoked or lost; it is safe to call from
// any goroutine, a batch being applied meanwhile included (its memory is
// then not kept either). It never waits.
func (s *Sink) Forget() { s.mem.forget() }
