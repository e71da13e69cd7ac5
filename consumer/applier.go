package consumer

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// applier applies batches on its own goroutine, in the order they were
// handed over, and commits each batch's offsets after its transaction, so
// that polling and decoding go on while PostgreSQL works. After a failed
// batch it applies nothing more: later batches' offsets would pass it.
type applier struct {
	c       *Consumer
	jobs    chan job
	pending sync.WaitGroup
	busy    atomic.Int64
	failed  atomic.Pointer[error]
	done    chan struct{}
	// finished is signalled (without blocking) when a batch leaves.
	finished chan struct{}
}

func newApplier(c *Consumer) *applier {
	return &applier{c: c, jobs: make(chan job, 1), done: make(chan struct{}), finished: make(chan struct{}, 1)}
}

// run applies batches until jobs is closed.
func (a *applier) run(ctx context.Context) {
	defer close(a.done)
	for j := range a.jobs {
		if a.failed.Load() == nil {
			if err := a.c.apply(ctx, j); err != nil {
				a.failed.Store(&err)
			} else {
				a.c.commit(ctx, j.offsets)
			}
		}
		a.busy.Add(-1)
		a.pending.Done()
		a.signal()
	}
}

// job is a prepared batch and the offsets its transaction records.
type job struct {
	prepared *sink.Prepared
	offsets  map[change.Partition]int64
	events   int
}

// submit hands a batch over; it blocks while another batch waits, until
// ctx ends (then the batch was not handed over).
func (a *applier) submit(ctx context.Context, j job) error {
	a.busy.Add(1)
	a.pending.Add(1)
	select {
	case a.jobs <- j:
		return nil
	case <-ctx.Done():
		a.busy.Add(-1)
		a.pending.Done()
		a.signal()
		return ctx.Err()
	}
}

// wait blocks until every submitted batch is applied (or dropped after a
// failure) and returns the failure, if any.
func (a *applier) wait() error {
	a.pending.Wait()
	return a.err()
}

// waitCtx is wait that gives up when ctx ends (a batch may be retrying an
// outage or a blocked table for a long time): it reports ctx's error then.
// It leaves no goroutine waiting behind (a WaitGroup may not be reused
// while one still waits on it).
func (a *applier) waitCtx(ctx context.Context) error {
	for a.busy.Load() > 0 {
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

func (a *applier) idle() bool { return a.busy.Load() == 0 }

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
