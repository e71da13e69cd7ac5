package apply

import (
	"sync/atomic"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/statecache"
	"go.uber.org/zap"
)

// Applier folds one table's share of a batch into its history inside the
// batch's transaction: the append path for keys whose events come after
// what the table holds, a repair for the others, primary-key changes in
// two steps, truncates, and isolation of the values PostgreSQL rejects.
// It keeps no state between batches but its counter; one transaction's
// goroutine uses it at a time per table.
type Applier struct {
	schema string
	log    *zap.Logger
	tune   *Tuning
	// cached is the sink's state cache lookup.
	cached func(k statecache.Key, boxes *change.Boxes, mem *fold.Mem) (*fold.Latest, bool)
	// bounded counts repairs that stopped at a boundary.
	bounded atomic.Int64
}

// Tuning holds the sizes the Applier works with; tests change them
// per Sink.
type Tuning struct {
	// WholeRepairs makes every repair read its key's whole history, and
	// UnboundedRepairs every partial one read on to the end (tests
	// compare the three ways; apply.go).
	WholeRepairs, UnboundedRepairs bool
	// TruncateChunk is how many keys a truncate folds again at a time:
	// memory holds one chunk's histories (truncate.go).
	TruncateChunk int
	// Unqueued writes each table's share of a batch at once, never
	// queued with the others' (history.Later; tests compare both).
	Unqueued bool
}

// New returns an Applier writing to the service's tables in
// schema, reading cached states through cached.
func New(schema string, log *zap.Logger, tune *Tuning, cached func(k statecache.Key, boxes *change.Boxes, mem *fold.Mem) (*fold.Latest, bool)) *Applier {
	return &Applier{schema: schema, log: log, tune: tune, cached: cached}
}

// Tune returns a's tuning.
func (a *Applier) Tune() *Tuning { return a.tune }

// BoundedRepairs counts the repairs that stopped at a boundary.
func (a *Applier) BoundedRepairs() int64 { return a.bounded.Load() }
