package consumer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
)

// applier applies batches on its own goroutine, in the order they were
// handed over, and commits each batch's offsets after its transaction, so
// that polling and decoding go on while PostgreSQL works. After a failed
// batch it applies nothing more: later batches' offsets would pass it.
//
// Batches can be abandoned (a rebalance that may not wait longer, a
// membership lost): the one being applied is cancelled, so its
// transaction rolls back, and those queued are dropped; none of them fails
// the applier, and none commits. The consumer then reads their records
// again (resync.go).
type applier struct {
	c    *Consumer
	jobs chan job
	busy atomic.Int64
	// probing counts parked targets' probes in flight (park.go): waited
	// for as batches are, but no batch waits behind them.
	probing atomic.Int64
	failed  atomic.Pointer[error]
	done    chan struct{}
	// finished is signalled (without blocking) when a batch leaves.
	finished chan struct{}
	// gen is the abandonment generation: a job submitted under an older
	// one is dropped. cancel cancels the job being applied.
	gen    atomic.Int64
	mu     sync.Mutex
	cancel context.CancelFunc
	// reconcileWarned is when an idle reconciliation's failure was last
	// logged (run's goroutine only).
	reconcileWarned time.Time
	// base is run's context: probes outlive the batch that started them.
	base context.Context
	// probes cancel the parked targets' probes in flight (park.go; mu).
	probes map[*context.CancelFunc]context.CancelFunc
}

func newApplier(c *Consumer) *applier {
	return &applier{c: c, jobs: make(chan job, 1), done: make(chan struct{}), finished: make(chan struct{}, 1),
		probes: map[*context.CancelFunc]context.CancelFunc{}}
}

// run applies batches until jobs is closed. While none comes it asks the
// sink about once per reconcileEvery to decide the snapshots that are
// ready (Sink.Reconcile): a recorded snapshot is decided by whichever
// member sees its topic applied past it, also when every partition is
// quiet.
func (a *applier) run(ctx context.Context) {
	defer close(a.done)
	a.base = ctx
	tick := time.NewTicker(reconcileEvery)
	defer tick.Stop()
	for {
		select {
		case j, ok := <-a.jobs:
			if !ok {
				return
			}
			if a.failed.Load() == nil && j.gen == a.gen.Load() {
				a.applyOne(ctx, j)
			}
			a.busy.Add(-1)
			a.signal()
		case <-tick.C:
			if a.failed.Load() == nil && a.idle() {
				a.reconcile(ctx)
			}
		}
	}
}

// reconcileEvery is how often an idle applier asks the sink to decide
// snapshots that are ready.
var reconcileEvery = time.Second

// reconcile runs Sink.Reconcile within reconcileBudget; a failure is
// logged (at most once a minute) and tried again at the next tick.
func (a *applier) reconcile(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, reconcileBudget)
	defer cancel()
	go func() {
		select {
		case <-a.c.drainStart: // a drain does not wait for it: the next start goes on
			cancel()
		case <-rctx.Done():
		}
	}()
	a.mu.Lock()
	a.cancel = cancel // an abandonment (a rebalance that may not wait) cuts it short too
	a.mu.Unlock()
	err := a.c.batches.Reconcile(rctx)
	a.mu.Lock()
	a.cancel = nil
	a.mu.Unlock()
	if err != nil && ctx.Err() == nil && time.Since(a.reconcileWarned) > time.Minute {
		a.reconcileWarned = time.Now()
		a.c.log.Warn("deciding completed snapshots failed; trying again", zap.Error(err))
	}
}

// reconcileBudget bounds one idle reconciliation: a large one goes on
// after the next batch (it is applied in chunks, each committed).
const reconcileBudget = 30 * time.Second

// applyOne applies and commits j unless it is abandoned meanwhile. An
// abandonment cancels the Kafka commit too, so that a broker that does
// not answer never holds the applier past the revoke budget (the offsets
// are in scd2sink_offsets; the next commit carries them).
func (a *applier) applyOne(ctx context.Context, j job) {
	jctx, cancel := context.WithCancel(ctx)
	a.mu.Lock()
	if j.gen != a.gen.Load() {
		a.mu.Unlock()
		cancel()
		return
	}
	a.cancel = cancel
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.cancel = nil
		a.mu.Unlock()
		cancel()
	}()
	start := time.Now()
	applied, err := a.c.applyJob(jctx, j)
	if ce := a.c.log.Check(zap.DebugLevel, "batch applied"); ce != nil {
		ce.Write(zap.Int("events", j.events), zap.Int("partitions", len(j.offsets)), zap.Duration("took", time.Since(start)), zap.Error(err))
	}
	abandoned := j.gen != a.gen.Load()
	switch {
	case abandoned:
		// Cancelled: rolled back (or, cancelled during its COMMIT, applied
		// without its Kafka commit: re-applying it is harmless).
	case errors.Is(err, errNotMember):
		a.c.requestResync(err.Error())
	case err != nil:
		a.failed.Store(&err)
	default:
		j.offsets = applied // without the parts of parked targets
		a.c.noteApplied(j)
		a.c.commit(jctx, applied)
	}
}

// abandon drops every batch handed over so far: the one being applied is
// cancelled, the queued ones are skipped. It does not wait; waitCtx does.
func (a *applier) abandon() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen.Add(1)
	if a.cancel != nil {
		a.cancel()
	}
	for _, cancel := range a.probes {
		cancel()
	}
}

// job is a prepared batch and the offsets its transaction records.
type job struct {
	prepared *sink.Prepared
	offsets  map[change.Partition]int64
	rewound  map[change.Partition]bool // offsets that replace the recorded ones
	events   int
	gen      int64
	// parkEpoch is the parking epoch its events were cut at (park.go).
	parkEpoch int64
	// alone are the parts of probing targets, left out of prepared:
	// prepared and applied by their probes (park.go).
	alone map[string]sink.Batch
}

// submit hands a batch over; it blocks while another batch waits, until
// ctx ends or interrupt (asked every 50ms; may be nil) reports true: then
// the batch was not handed over.
//
// j.gen is the abandonment generation the batch was cut under.
func (a *applier) submit(ctx context.Context, j job, interrupt func() bool) error {
	a.busy.Add(1)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case a.jobs <- j:
			return nil
		case <-ctx.Done():
			a.unsubmit()
			return ctx.Err()
		case <-tick.C:
			if interrupt != nil && interrupt() {
				a.unsubmit()
				return errRebalance
			}
		}
	}
}

func (a *applier) unsubmit() {
	a.busy.Add(-1)
	a.signal()
}

// waitCtx blocks until every submitted batch is applied (or dropped)
// and returns the failure, if any; it gives up when ctx ends (a batch may be retrying an
// outage or a blocked table for a long time): it reports ctx's error then.
// It leaves no goroutine waiting behind (a WaitGroup may not be reused
// while one still waits on it).
func (a *applier) waitCtx(ctx context.Context) error {
	for a.busy.Load() > 0 || a.probing.Load() > 0 {
		select {
		case <-a.finished:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return a.err()
}

// signal wakes a waitCtx: a batch left the applier.
func (a *applier) signal() {
	select {
	case a.finished <- struct{}{}:
	default:
	}
}

// idle reports whether nothing is being applied: no batch, no probe.
func (a *applier) idle() bool { return a.busy.Load() == 0 && a.probing.Load() == 0 }

// jobsIdle reports whether no batch is being applied or waits (probes
// aside): a batch that is old enough goes to it at once.
func (a *applier) jobsIdle() bool { return a.busy.Load() == 0 }

// queued reports whether a batch waits behind the one being applied.
func (a *applier) queued() bool { return a.busy.Load() >= 2 }

func (a *applier) err() error {
	if p := a.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// stop lets the applier finish and ends its goroutine.
func (a *applier) stop() {
	close(a.jobs)
	<-a.done
}
