package sink

import (
	"context"

	"github.com/scd2sink/scd2sink/sink/apply"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/erasure"
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
	// Ledger records the batches' progress and dead letters (ledger.go).
	*Ledger
	cfg  Config
	pool *pgxpool.Pool
	log  *zap.Logger
	// reg knows the targets' specs and tables (registry.go, registry_ddl.go);
	// its mu is held while a batch is prepared.
	reg *registry
	// mem is what the Sink remembers of what it wrote (memory.go).
	mem *memory
	// recon decides completed full snapshots (reconcile.go).
	recon *reconciler
	// planner turns batches into plans (package plan), under reg.mu.
	planner plan.Planner
	// parts is how many parts a batch may be applied in (parallel.go).
	parts int
	// erasures knows the erased keys (package erasure).
	erasures *erasure.Set
	// tune holds sizes and hooks (tuning.go; tests change them before
	// the first batch); stats counts the ways batches took.
	tune  tuning
	stats counters
	// applier folds tables' shares of a batch (package apply).
	applier *apply.Applier
	// maint is the history's upkeep (package maint, upkeep.go).
	maint *maint.Maint
}

// New validates cfg and returns a Sink writing through pool. Call Init before
// the first Apply.
func New(cfg Config, pool *pgxpool.Pool) (*Sink, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Sink{cfg: cfg, pool: pool, log: cfg.Logger, planner: plan.NewPlanner(),
		mem: newMemory(cfg.CacheKeys, cfg.CacheBytes), tune: defaultTuning()}
	s.reg = newRegistry(&s.cfg, pool)
	s.applier = apply.New(cfg.Schema, cfg.Logger, &s.tune.Apply, s.mem.cached)
	s.recon = &reconciler{s: s}
	s.recon.pending.Store(true)
	// Parts of a batch applied side by side (parallel.go), each on its own
	// connection: Prepare and the consumer's bookkeeping need two more.
	s.parts = max(1, cfg.ApplyWorkers)
	if pool != nil {
		s.parts = min(s.parts, max(1, int(pool.Config().MaxConns)-2))
	}
	s.erasures = erasure.New(erasure.Config{Schema: cfg.Schema, Secret: cfg.ErasureSecret, Group: cfg.ConsumerGroup, DeadLetters: cfg.DeadLetterTable,
		Retry: s.withRetry, Alias: cfg.ErasureAlias, DecodeKey: cfg.DecodeKey, Spec: s.reg.spec})
	s.Ledger = &Ledger{schema: cfg.Schema, group: cfg.ConsumerGroup, deadLetters: cfg.DeadLetterTable, pool: pool, log: cfg.Logger,
		mem: s.mem, erasures: s.erasures, spec: s.reg.spec}
	s.maint = maint.New(maint.Config{Schema: cfg.Schema, ConsumerGroup: cfg.ConsumerGroup, Patterns: cfg.Resolve != nil,
		Logger: cfg.Logger, Retry: s.withRetry, Tuning: &s.tune.Tuning}, pool, upkeepView{s})
	return s, nil
}

// Init creates the service's own tables and every configured history table
// that declares its columns, retrying transient errors.
func (s *Sink) Init(ctx context.Context) error {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	err := once(ctx, s.pool, func(ctx context.Context) error {
		if err := catalog.EnsureService(ctx, s.pool, catalog.Service{Schema: s.cfg.Schema, DeadLetterTable: s.cfg.DeadLetterTable,
			ReorderWindow: s.cfg.ReorderWindow, Logger: s.log}); err != nil {
			return err
		}
		for _, spec := range s.cfg.Tables {
			if len(spec.Keys) == 0 {
				keys, err := s.reg.existingKeys(ctx, spec)
				if err != nil {
					return err
				}
				spec.Keys = keys
				s.reg.setSpec(spec)
			}
			if len(spec.Columns) == 0 || len(spec.Keys) == 0 {
				continue
			}
			t, err := ensureTable(ctx, s.pool, spec, nil)
			if err != nil {
				return err
			}
			s.reg.warnPlain(t)
			s.reg.tables[spec.Target] = t
		}
		// A writer that could not recognise erased keys must not start.
		return s.erasures.Reload(ctx, s.pool)
	})
	return err
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
