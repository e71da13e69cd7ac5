package sink

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/sink/plan"
	"go.uber.org/zap"
)

// registry is what a Sink knows of its targets: their specs (the
// configured ones and those cfg.Resolve gave, keys learnt from existing
// tables), and the history tables it has loaded or created, with the
// DDL that brings them to a batch's columns (registry_ddl.go). tables is
// guarded by mu, which Prepare holds while it plans (a batch's plan
// refers to the descriptions it was made for); specs and snapDeletes by
// specMu, so that the applying goroutine and maintenance read specs
// without waiting for a Prepare's DDL.
type registry struct {
	mu   sync.Mutex
	cfg  *Config
	pool *pgxpool.Pool
	log  *zap.Logger
	// plainWarned holds the targets warned about by warnPlain.
	plainWarned sync.Map
	specMu      sync.Mutex
	specs       map[string]TableSpec
	// snapDeletes are the targets with SnapshotDeletes.
	snapDeletes map[string]bool
	tables      map[string]*plan.Table
}

// newRegistry knows the configured targets.
func newRegistry(cfg *Config, pool *pgxpool.Pool) *registry {
	r := &registry{cfg: cfg, pool: pool, log: cfg.Logger, specs: map[string]TableSpec{}, snapDeletes: map[string]bool{}, tables: map[string]*plan.Table{}}
	for _, t := range cfg.Tables {
		r.specs[t.Target] = t
		r.snapDeletes[t.Target] = t.SnapshotDeletes
	}
	return r
}

// spec returns target's spec, asking cfg.Resolve for a target it does
// not know yet.
func (r *registry) spec(target string) (TableSpec, bool) {
	r.specMu.Lock()
	defer r.specMu.Unlock()
	if spec, ok := r.specs[target]; ok {
		return spec, true
	}
	if r.cfg.Resolve == nil {
		return TableSpec{}, false
	}
	spec, ok := r.cfg.Resolve(target)
	if !ok || spec.Target != target {
		return TableSpec{}, false
	}
	if err := r.cfg.specDefaults(&spec); err != nil {
		r.log.Error("a resolved table is not valid", zap.String("target", target), zap.Error(err))
		return TableSpec{}, false
	}
	r.specs[target] = spec
	r.snapDeletes[target] = spec.SnapshotDeletes
	return spec, true
}

// setSpec replaces target's spec (its keys learnt).
func (r *registry) setSpec(spec TableSpec) {
	r.specMu.Lock()
	r.specs[spec.Target] = spec
	r.specMu.Unlock()
}

// snapshotDeletes reports whether target closes what a full snapshot did
// not read.
func (r *registry) snapshotDeletes(target string) bool {
	r.specMu.Lock()
	defer r.specMu.Unlock()
	return r.snapDeletes[target]
}

// anySnapshotDeletes reports whether a known target closes what a full
// snapshot did not read.
func (r *registry) anySnapshotDeletes() bool {
	r.specMu.Lock()
	defer r.specMu.Unlock()
	for _, on := range r.snapDeletes {
		if on {
			return true
		}
	}
	return false
}

// existingKeys reads the key columns of an existing history table from its
// (key columns, scd_seq) index; none when the table does not exist yet.
func (r *registry) existingKeys(ctx context.Context, spec TableSpec) ([]string, error) {
	return KeyColumns(ctx, r.pool, spec.Schema, spec.Target)
}
