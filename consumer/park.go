package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/scd2sink/scd2sink/consumer/park"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
)

// One table's trouble stays in its table (DESIGN.md section 6): package
// park decides when a parked target's partitions are paused, read again
// and probed, and which part of a batch is left out; here the consumer
// parks targets (and says so: log, /readyz, scd2sink_target_blocked),
// pauses, drops and rewinds their partitions, leaves their parts out of
// batches, and applies the probes.

// parkTarget parks target after err (or parks it again after a probe
// failed, with a longer backoff). Called by the applier and, for
// failures preparing a batch, by the poll loop.
func (c *Consumer) parkTarget(target string, err error) {
	class := c.cfg.Classify(err)
	blocked := class == sink.Blocked || class == sink.Data
	pk := c.park.Park(target, err, blocked, blockedLogEvery)
	state := sink.SQLState(err)
	c.m.Retries.WithLabelValues(state).Inc()
	c.m.TargetBlocked.WithLabelValues(target).Set(1)
	c.health.Park(target, sink.Summary(err), pk.Since)
	c.health.Wait("target "+target, fmt.Sprintf("target %s parked (its partitions paused, the other targets go on), retrying in %s: %s", target, pk.Backoff, sink.Summary(err)))
	if !pk.Log {
		return
	}
	fields := []zap.Field{zap.String("target", target), zap.String("sqlstate", state), zap.Duration("retry_in", pk.Backoff),
		zap.Duration("parked_for", time.Since(pk.Since).Round(time.Second)), zap.Error(err)}
	if blocked {
		c.log.Error("progress of this table stopped until this is fixed; the other tables go on (retrying slowly; a fix made live is picked up)",
			append(fields, zap.String("hint", sink.Hint(err)))...)
	} else {
		c.log.Warn("this table is parked while its statements wait (a lock or statement timeout); the other tables go on", fields...)
	}
}

// unparked is the end of a parking: its partitions are read again after
// a probe applied, or none of them is assigned any more.
func (c *Consumer) unparked(target string, st park.Ended) {
	c.m.TargetBlocked.WithLabelValues(target).Set(0)
	c.health.Unpark(target)
	c.health.Wait("target "+target, "")
	msg := "table applied again: parking over"
	if !st.Applied {
		msg = "parking over: none of the table's partitions is assigned here any more"
	}
	c.log.Info(msg, zap.String("target", target), zap.Duration("parked_for", time.Since(st.Since).Round(time.Millisecond)))
}

// syncParked pauses, drops and rewinds the partitions of targets parked
// since the last look, and reads again those whose backoff is over. It
// runs on the poll loop, while no rebalance callback runs.
func (c *Consumer) syncParked() {
	k := &c.park
	if k.Idle() {
		return
	}
	// mu first: no batch is cut (a revoke flushes too) between a new
	// epoch and the drop of what was read before it.
	c.mu.Lock()
	defer c.mu.Unlock()
	owned := map[string]bool{}
	for p := range c.assigned {
		owned[c.target(p.Topic)] = true
	}
	hold, resume, ended := k.Sync(owned)
	for t, st := range ended {
		c.unparked(t, st)
	}
	var drop, pause, unpause []change.Partition
	for p := range c.assigned {
		t := c.target(p.Topic)
		was := k.PausedFor(p)
		switch {
		case resume[t]:
			drop = append(drop, p)
			if was {
				unpause = append(unpause, p)
			}
		case hold[t] && !was:
			drop, pause = append(drop, p), append(pause, p)
		}
	}
	if len(drop) > 0 {
		c.rereadLocked(drop)
	}
	k.SetPaused(pause, unpause)
	if len(pause) > 0 {
		c.client.PauseFetchPartitions(byTopic(pause))
	}
	if len(unpause) > 0 {
		c.waitMu.Lock()
		kept := unpause[:0]
		for _, p := range unpause {
			if _, held := c.paused[p]; !held { // held back for the registry: resumed by resumeDue
				kept = append(kept, p)
			}
		}
		unpause = kept
		c.waitMu.Unlock()
	}
	if len(unpause) > 0 {
		c.client.ResumeFetchPartitions(byTopic(unpause))
		c.log.Info("reading a parked table's partitions again", zap.Any("partitions", byTopic(unpause)))
	}
}

// rereadLocked drops what is buffered of parts and puts their reading
// position back to what was applied of them (resync's rule, for these
// partitions only). Called on the poll loop with mu held.
func (c *Consumer) rereadLocked(parts []change.Partition) {
	c.commitMu.Lock()
	at := map[change.Partition]int64{}
	for _, p := range parts {
		o, ok := c.origin[p]
		if !ok {
			continue // no position yet: the assignment's own applies
		}
		if a, ok := c.appliedTo[p]; ok && a > o {
			o = a
		}
		at[p] = o
	}
	c.commitMu.Unlock()
	seeds := c.anchors.At(at)
	c.seq.DropPartitions(parts)
	c.anchors.Drop(parts)
	c.dropPending(parts)
	set := map[change.Partition]bool{}
	for _, p := range parts {
		set[p] = true
	}
	for ev := range c.snaps {
		if set[ev.Origin.Partition] {
			delete(c.snaps, ev)
		}
	}
	for p, o := range at {
		if seeds[p] != nil {
			c.anchors.Resume(p, o, seeds[p])
		}
		c.next[p] = o
	}
	c.noteBuffer()
	c.seekTo(at)
	c.log.Debug("partitions read again from what was applied of them", zap.String("at", fmt.Sprint(at)))
}

// releaseParked forgets partitions given up (revoked, lost) that were
// paused for parking, and resumes them for a later assignment (which
// pauses them again while their target is parked).
func (c *Consumer) releaseParked(parts []change.Partition) {
	resume := c.park.Release(parts)
	if len(resume) > 0 {
		c.client.ResumeFetchPartitions(byTopic(resume))
	}
}

func byTopic(parts []change.Partition) map[string][]int32 {
	out := map[string][]int32{}
	for _, p := range parts {
		out[p.Topic] = append(out[p.Topic], p.Partition)
	}
	for _, ps := range out {
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	}
	return out
}

// applyJob applies a job, keeping parked targets out: their parts are
// left to be read again, a probing target's part is applied on its own
// (a probe, on a goroutine of its own: a trouble that lasts costs the
// others nothing), and a target whose statements fail as ParkTarget says
// is parked and the rest applied without it. It returns the offsets that were
// applied (those of parts left out are not).
func (c *Consumer) applyJob(ctx context.Context, j job) (map[change.Partition]int64, error) {
	if j.prepared == nil { // a sink that prepares nothing (tests)
		return j.offsets, c.apply(ctx, j, nil)
	}
	skip, probe := c.park.Rules(j.parkEpoch)
	out := map[string]bool{} // targets whose part is not applied
	var probes []string
	main := j.prepared
	targets := main.Targets()
	if c.park.Any() || j.parkEpoch < c.park.Now() {
		for _, t := range targets {
			switch {
			case skip(t):
				out[t] = true
			case probe(t):
				probes = append(probes, t)
			}
		}
	}
	if len(out) > 0 || len(probes) > 0 {
		if ce := c.log.Check(zap.DebugLevel, "parked targets left out of a batch"); ce != nil {
			ce.Write(zap.Int64("epoch", j.parkEpoch), zap.Any("out", out), zap.Strings("probes", probes), zap.String("offsets", fmt.Sprint(j.offsets)))
		}
	}
	var aside *sink.Prepared
	if len(out) > 0 || len(probes) > 0 {
		main, aside = j.prepared.Split(func(t string) bool { return out[t] || slices.Contains(probes, t) })
	}
	for main != nil {
		err := c.apply(ctx, j, main)
		if err == nil {
			break
		}
		t, ok := sink.ParkTarget(err)
		if !ok || ctx.Err() != nil {
			return nil, err
		}
		c.parkTarget(t, err)
		out[t] = true
		main, _ = main.Split(func(x string) bool { return x == t })
	}
	for _, t := range probes {
		if aside == nil {
			break
		}
		var part *sink.Prepared
		aside, part = aside.Split(func(x string) bool { return x == t })
		out[t] = true // committed by the probe, not by this job
		if part != nil && c.park.StartProbe(t, j.parkEpoch) {
			c.applier.probe(ctx, j, t, part, nil)
		}
	}
	for _, t := range slices.Sorted(maps.Keys(j.alone)) {
		b := j.alone[t]
		if c.park.StartProbe(t, j.parkEpoch) {
			c.applier.probe(ctx, j, t, nil, &b)
		}
	}
	applied := make(map[change.Partition]int64, len(j.offsets))
	for p, o := range j.offsets {
		if !out[c.target(p.Topic)] {
			applied[p] = o
		}
	}
	now := float64(time.Now().UnixNano()) / 1e9
	for _, t := range targets {
		if !out[t] {
			c.m.TargetApplied.WithLabelValues(t).Set(now)
		}
	}
	return applied, nil
}

// withoutParked leaves out of a batch, before it is prepared, the events,
// dead letters, snapshots and offsets of targets that are parked (not
// probing) or that skip says to. Called with mu held.
func (c *Consumer) withoutParked(b sink.Batch, skip func(string) bool) sink.Batch {
	has := false
	for p := range b.Positions {
		has = has || skip(c.target(p.Topic))
	}
	for _, ev := range b.Events {
		has = has || skip(ev.Table)
	}
	for _, d := range b.DeadLetters {
		has = has || skip(c.deadTarget(d))
	}
	if !has {
		return b
	}
	positions := make(map[change.Partition]sink.Position, len(b.Positions))
	for p, pos := range b.Positions {
		if !skip(c.target(p.Topic)) {
			positions[p] = pos
		}
	}
	evs := make([]*change.Event, 0, len(b.Events))
	for _, ev := range b.Events {
		if !skip(ev.Table) {
			evs = append(evs, ev)
		}
	}
	var dead []sink.DeadLetter
	for _, d := range b.DeadLetters {
		if !skip(c.deadTarget(d)) {
			dead = append(dead, d)
		}
	}
	var snaps []sink.Snapshot
	for _, sn := range b.Snapshots {
		if !skip(sn.Target) {
			snaps = append(snaps, sn)
		}
	}
	b.Positions, b.Events, b.DeadLetters, b.Snapshots = positions, evs, dead, snaps
	return b
}

func (c *Consumer) deadTarget(d sink.DeadLetter) string {
	if d.Table != "" {
		return d.Table
	}
	return c.target(d.Origin.Topic)
}

// probe applies a parked target's part of job j on a goroutine of its own,
// counted as busy (a rebalance and a drain wait for it; an abandonment
// cancels it). Its offsets are recorded in its own transaction and
// committed to Kafka after it; a failure parks the target again. With
// part nil, alone is the target's part, prepared there first.
func (a *applier) probe(ctx context.Context, j job, target string, part *sink.Prepared, alone *sink.Batch) {
	c := a.c
	if a.base != nil {
		ctx = a.base // not the batch's: it ends with the batch
	}
	pctx, cancel := context.WithCancel(ctx)
	a.mu.Lock()
	if j.gen != a.gen.Load() {
		// Abandoned while its main part was applied (a rebalance, lost
		// partitions): nothing more of it is applied; everything is read
		// again (resync).
		a.mu.Unlock()
		cancel()
		c.park.ProbeDone(target)
		return
	}
	a.probing.Add(1)
	a.probes[&cancel] = cancel
	a.mu.Unlock()
	go func() {
		defer func() {
			a.mu.Lock()
			delete(a.probes, &cancel)
			a.mu.Unlock()
			cancel()
			a.probing.Add(-1)
			a.signal()
		}()
		gen := j.gen
		offsets := j.offsets
		var err error
		if alone != nil {
			j.offsets, j.rewound, j.events = sink.Offsets(alone.Positions), rewoundOf(alone.Positions), len(alone.Events)
			offsets = j.offsets
			part, err = c.prepareAlone(pctx, *alone)
		}
		if err == nil {
			err = c.applyWith(pctx, j, part, c.batches.ApplyPart)
		}
		switch {
		case gen != a.gen.Load():
			// Abandoned meanwhile: everything is read again (resync).
			c.park.ProbeDone(target)
		case errors.Is(err, errNotMember):
			c.park.ProbeDone(target)
			c.requestResync(err.Error())
		case err != nil && pctx.Err() != nil:
			// Cut short by a rebalance or a drain: decided nothing.
			c.park.ProbeDone(target)
		case err != nil:
			if _, ok := sink.ParkTarget(err); ok {
				c.parkTarget(target, err)
				return
			}
			a.failed.Store(&err)
		default:
			offs := map[change.Partition]int64{}
			for p, o := range offsets {
				if c.target(p.Topic) == target {
					offs[p] = o
				}
			}
			c.log.Debug("a parked target's probe applied", zap.String("target", target), zap.String("offsets", fmt.Sprint(offs)), zap.Bool("events", part.HasEvents()))
			pj := j
			pj.offsets = offs // noteApplied looks at rewound partitions among these only
			c.noteApplied(pj)
			c.commit(pctx, offs)
			c.m.TargetApplied.WithLabelValues(target).Set(float64(time.Now().UnixNano()) / 1e9)
			if part.HasEvents() {
				c.park.Unpark(target)
			} else {
				c.park.ProbeDone(target)
			}
		}
	}()
}

// prepareAlone prepares a probing target's part of a batch, on its
// probe's goroutine, retrying transient errors until ctx ends.
func (c *Consumer) prepareAlone(ctx context.Context, b sink.Batch) (*sink.Prepared, error) {
	var p *sink.Prepared
	what := fmt.Sprintf("preparing a parked table's part of %d events", len(b.Events))
	err := c.retry(ctx, "prepare", what, func() (err error) {
		defer c.recoverPanic(what, sink.Offsets(b.Positions), &err)
		p, err = c.batches.Prepare(ctx, b)
		return err
	})
	return p, err
}

// cancelProbes cuts the probes in flight short: a rebalance does not wait
// for a parked table's probe (a statement timeout's may run for minutes);
// the table stays parked and is read again afterwards.
func (a *applier) cancelProbes() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, cancel := range a.probes {
		cancel()
	}
}
