package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sequencer"
	"github.com/scd2sink/scd2sink/sink"
)

// Batching: what the sequencer releases collects into a pending batch,
// handed to the applier when it is big or old enough (group commit).

// collect adds what the sequencer released to the pending batch. The
// batch's age is its oldest event's: the time an event waited in the
// reorder window counts towards batch_max_wait.
func (c *Consumer) collect(out sequencer.Output) {
	if out.Len() > 0 && len(c.pending) == 0 && len(c.dead) == 0 {
		c.since = time.Now()
	}
	for _, ev := range out.Events {
		if ev.Received > 0 && ev.Received < c.since.UnixNano() {
			c.since = time.Unix(0, ev.Received)
		}
	}
	c.pending = append(c.pending, out.Events...)
	for _, ev := range out.Events {
		c.pendBytes += int64(ev.Size())
	}
	for _, cf := range out.Conflicts {
		c.dead = append(c.dead, conflictLetter(cf))
	}
}

func conflictLetter(cf sequencer.Conflict) sink.DeadLetter {
	ev := cf.Event
	// Its Kafka bytes are not kept: the record is read again by its
	// coordinates when the dead letter is replayed (Decoded).
	return sink.DeadLetter{Origin: ev.Origin, Table: ev.Table, Key: keyJSON(ev.Key),
		Value: []byte(fmt.Sprintf("op=%s seq=%s after=%s", ev.Op, ev.Seq, ev.AfterJSON)), Err: cf.Err.Error(), Decoded: true, Reason: sink.ReasonConflict}
}

// maybeFlush takes what is due from the sequencer and applies the pending
// batch when it is big or old enough (or force). Called with mu held.
func (c *Consumer) maybeFlush(ctx context.Context, force bool) error {
	if quiet := c.quietTargets(time.Now()); len(quiet) > 0 {
		c.collect(c.seq.ReleaseQuiet(func(target string) bool { return quiet[target] }))
	} else {
		c.collect(c.seq.Release())
	}
	c.noteBuffer()
	n := len(c.pending) + len(c.dead)
	// A batch that is old enough goes at once to an idle applier. While
	// the applier is busy it grows (group commit) and is prepared and
	// queued behind the running one when it is half full, so that the
	// applier finds it ready; while one is queued it waits.
	old := n > 0 && c.old(time.Now())
	due := n >= c.cfg.BatchMaxEvents || c.pendBytes+c.deadBytes() >= c.cfg.BatchMaxBytes/3 || (old && c.applier.jobsIdle()) ||
		(old && !c.applier.queued() && n >= c.cfg.BatchMaxEvents/2)
	if !due && !force && !c.commitStale() {
		return nil
	}
	return c.flush(ctx, c.interrupted)
}

// old reports whether the pending batch is old enough to go to an idle
// applier: its oldest item is batch_max_wait old and the last batch was
// handed over at least batch_max_wait ago; or, when the reorder
// window is shorter than batch_max_wait, its oldest item waited out the
// window and the last batch was handed over at least coalesce ago (so
// that a steady trickle still makes batches of coalesce's worth of
// releases, at most 1/coalesce transactions a second, not one per poll). What this changes
// is the trickle, the tail of a backlog and the first batch after a
// start: they are applied about the window after their first event
// instead of batch_max_wait. Under load the applier is busy and batches
// grow as before. Events the window does not hold (no key, dead letters,
// a full buffer's early release) wait that long too, which is harmless.
func (c *Consumer) old(now time.Time) bool { return !now.Before(c.oldAt()) }

// oldAt is when the pending batch becomes old (see old); the poll loop
// wakes then (pollWait).
func (c *Consumer) oldAt() time.Time {
	at := c.since.Add(c.cfg.BatchMaxWait)
	if w := c.cfg.ReorderWindow; w > 0 && w < c.cfg.BatchMaxWait {
		early := c.since.Add(w)
		if o := c.flushed.Add(c.coalesce()); o.After(early) {
			early = o
		}
		if early.Before(at) {
			at = early
		}
		return at
	}
	// A window as long as batch_max_wait or longer releases events older
	// than batch_max_wait already: under a steady load every poll found
	// the batch old, and the applier took whatever had been released
	// whenever it was idle, back to back. Transactions of a few changes
	// per table each then cost more per change than folding them
	// (BenchmarkSoak, 3,000 changes/s over 20 tables: 14 a second, 153 µs
	// of CPU per change). At most one a batch_max_wait instead, unless the
	// batch is big (maybeFlush).
	if o := c.flushed.Add(c.cfg.BatchMaxWait); o.After(at) {
		at = o
	}
	return at
}

// coalesce is how long after a hand-over the next one may come early
// (old): batch_max_wait less the window, at most a twenty-fifth of
// batch_max_wait (10ms by default). It is what a trickle's event may wait
// for the hand-over after its window: at 25ms the produce-to-visible p99
// at 1,000 events/s was the window + 58 ms, at 10ms the window + 42 ms
// (BenchmarkLatency), for 2.3 times the transactions.
func (c *Consumer) coalesce() time.Duration {
	return min(c.cfg.BatchMaxWait-c.cfg.ReorderWindow, c.cfg.BatchMaxWait/25)
}

// deadBytes is the memory the pending dead letters hold (copies of their
// records): they count towards batch_max_bytes as events do, so that a
// flood of large bad records is handed over (and, while the applier is
// busy, stops the poll loop) like any batch instead of piling up.
// Called with mu held.
func (c *Consumer) deadBytes() int64 {
	var n int64
	for _, d := range c.dead {
		n += int64(len(d.Key) + len(d.Value) + len(d.Err) + 64)
		for _, h := range d.Headers {
			n += int64(len(h.Key) + len(h.Value))
		}
	}
	return n
}

// interrupted reports whether the poll loop should stop handing batches
// over: a rebalance waits, or batches were abandoned.
func (c *Consumer) interrupted() bool {
	return c.rebalanceWanted.Load() || c.resyncWhy.Load() != nil
}

// commitStale reports whether commit points moved (skipped records) with
// nothing to apply, and it is time to record them.
func (c *Consumer) commitStale() bool {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	if time.Since(c.lastCommit) < c.cfg.BatchMaxWait {
		return false
	}
	for p, o := range c.seq.CommitPoints() {
		if c.committed[p] != o {
			return true
		}
	}
	return false
}

// flush hands the pending events to the applier in batches of at most
// BatchMaxEvents and a third of BatchMaxBytes (so that the batch applying,
// the one queued behind it and the one waiting to be queued hold at most
// BatchMaxBytes), each with the commit points it makes true; the applier
// applies them in order and commits those to Kafka. Called with mu held.
//
// interrupt, when set, is asked while the applier's queue is full: when
// it reports true, flush stops with errRebalance and what was not handed
// over stays pending.
func (c *Consumer) flush(ctx context.Context, interrupt func() bool) error {
	if err := c.applier.err(); err != nil {
		return err
	}
	// Batches handed over after an abandonment would commit offsets past
	// the abandoned ones' events: stop, and stamp every batch with the
	// abandonment generation of now, so that a later abandonment drops it.
	gen := c.applier.gen.Load()
	if c.resyncWhy.Load() != nil {
		return errRebalance
	}
	if interrupt != nil {
		// Prepare may retry an outage (DDL); a rebalance must not wait for it.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if interrupt() {
						cancel()
						return
					}
				}
			}
		}()
	}
	c.commitMu.Lock()
	c.lastCommit = time.Now()
	c.commitMu.Unlock()
	c.flushed = time.Now()
	for first := true; first || len(c.pending) > 0; first = false {
		n := min(len(c.pending), c.cfg.BatchMaxEvents)
		var size int64
		for i, ev := range c.pending[:n] {
			if size += int64(ev.Size()); size > c.cfg.BatchMaxBytes/3 && i > 0 {
				n = i
				break
			}
		}
		rest := c.pending[n:]
		offsets := c.commitPoints(rest)
		snaps := c.snapshotsIn(c.pending[:n])
		epoch := c.park.Now()
		j, err := c.prepare(ctx, sink.Batch{Events: c.pending[:n:n], DeadLetters: c.dead, Positions: c.positions(c.pending[:n], offsets),
			Confirm: c.confirmMember, Snapshots: snaps}, epoch)
		if err != nil {
			if interrupt != nil && interrupt() && ctx.Err() != nil {
				return errRebalance
			}
			return err
		}
		j.gen = gen
		if err := c.applier.submit(ctx, j, interrupt); err != nil {
			if interrupt != nil && interrupt() && ctx.Err() != nil {
				return errRebalance
			}
			return err
		}
		c.forgetSnapshots(c.pending[:n], len(snaps))
		for _, ev := range c.pending[:n] {
			c.pendBytes -= int64(ev.Size())
		}
		c.pending, c.dead = rest, nil
	}
	c.pending, c.pendBytes = nil, 0
	c.noteBuffer()
	return nil
}

// flushAndWait flushes and waits until everything handed over is applied
// and committed. Called with mu held.
func (c *Consumer) flushAndWait(ctx context.Context) error {
	if err := c.flush(ctx, nil); err != nil {
		return err
	}
	return c.applier.waitCtx(ctx)
}

// commitPoints is the sequencer's commit points held below every event of
// rest, which is released but not applied yet.
func (c *Consumer) commitPoints(rest []*change.Event) map[change.Partition]int64 {
	offsets := c.seq.CommitPoints()
	for _, ev := range rest {
		if o, ok := offsets[ev.Origin.Partition]; ok && ev.Origin.Offset < o {
			offsets[ev.Origin.Partition] = ev.Origin.Offset
		}
	}
	return offsets
}

// positions are what a batch of evs records per partition of offsets
// (sink.Position): the offset, the anchor below it, the topic's ID and
// target, whether it was rewound on purpose, and the valid time of the
// last event below it.
func (c *Consumer) positions(evs []*change.Event, offsets map[change.Partition]int64) map[change.Partition]sink.Position {
	anchors, rewound, valid := c.anchors.At(offsets), c.rewoundIn(offsets), lastValid(evs, offsets)
	targets := map[string]string{}
	out := make(map[change.Partition]sink.Position, len(offsets))
	for p, o := range offsets {
		t, ok := targets[p.Topic]
		if !ok {
			t = c.target(p.Topic)
			targets[p.Topic] = t
		}
		out[p] = sink.Position{Offset: o, Anchor: anchors[p], TopicID: c.topicIDs[p.Topic], Rewound: rewound[p], Target: t, LastValid: valid[p]}
	}
	return out
}

// rewoundOf names the positions rewound on purpose (nil: none).
func rewoundOf(positions map[change.Partition]sink.Position) map[change.Partition]bool {
	var out map[change.Partition]bool
	for p, pos := range positions {
		if pos.Rewound {
			if out == nil {
				out = map[change.Partition]bool{}
			}
			out[p] = true
		}
	}
	return out
}

// lastValid is, per partition of offsets, just before the valid time of
// the batch's event with the highest offset below the partition's offset:
// everything below that offset is applied once the batch is, and the
// events after it are not earlier; one of them may have the same valid
// time (another row of its transaction), hence a microsecond less (the
// watermark, watermark.go). Snapshot reads do not count: their time is
// when they were read, and changes streamed after them may be older.
func lastValid(evs []*change.Event, offsets map[change.Partition]int64) map[change.Partition]time.Time {
	at := map[change.Partition]int64{}
	out := map[change.Partition]time.Time{}
	for _, ev := range evs {
		p, o := ev.Origin.Partition, ev.Origin.Offset
		if next, ok := offsets[p]; !ok || o >= next || ev.ValidFrom.IsZero() || ev.Op == change.OpRead {
			continue
		}
		if best, seen := at[p]; !seen || o > best {
			at[p], out[p] = o, ev.ValidFrom.Add(-time.Microsecond)
		}
	}
	return out
}

// keyJSON is a decoded key as a JSON array (what erase matches a dead
// letter's key by).
func keyJSON(key []any) []byte {
	b, err := json.Marshal(key)
	if err != nil {
		return []byte(fmt.Sprint(key))
	}
	return b
}
