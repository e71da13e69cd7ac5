package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
)

// One table's trouble stays in its table (DESIGN.md section 6).
//
// A failure that belongs to one target (sink.ParkTarget: a lock or
// statement timeout, a table changed by hand, a missing privilege,
// schema_changes: fail, a value isolation could not resolve) parks that
// target: the batch is applied again without it, so every other target
// goes on applying and committing, and the target's partitions are paused,
// their buffered events dropped and their reading position put back to
// what was applied of them. Nothing of a parked target is committed past
// what was applied. After a backoff (parkBackoffMin doubling to
// parkBackoffMax, parkBlockedMax for blocked errors) its partitions are
// read again from there, and the first batches holding its events are
// prepared (its DDL too: a column added while a DBA holds the table) and
// applied in transactions of their own, on a goroutine of their own (a
// probe), so that a trouble that lasts costs the others nothing; the first probe that applies its events
// un-parks it. /readyz names each parked target and why;
// scd2sink_target_blocked{target} is 1 while it is parked.
//
// Which part of a batch may be applied is decided by epochs: every park
// and every resume of a target takes the next epoch, and each batch is
// stamped with the epoch at which its events were taken. A target's part
// of a batch cut before its last park or resume is never applied: its
// events may follow events that were dropped, and they are read again.

// Backoff of a parked target.
var (
	parkBackoffMin = time.Second
	parkBackoffMax = 10 * time.Second // lock and statement timeouts
	parkBlockedMax = 30 * time.Second // a table changed by hand, a missing grant
)

// parkState is one parked target.
type parkState struct {
	err     error
	since   time.Time
	until   time.Time // when its partitions are read again
	backoff time.Duration
	probing bool // read again: its parts are applied on their own
	settled bool // the poll loop dropped and paused its partitions
	// inflight: a probe is being applied (on a goroutine of its own);
	// the target's parts of other batches are left out meanwhile.
	inflight bool
	// done: a probe applied its events; the parts left out meanwhile
	// are still left out until the poll loop reads its partitions again
	// from what was applied (then the parking ends).
	done bool
	// reread: a probe ended without deciding (it applied no event); the
	// parts left out meanwhile are left out until the poll loop reads
	// the partitions again, and the target goes on probing.
	reread  bool
	logged  string
	loggedA time.Time
}

// parking is the parked targets, shared by the applier (which parks and
// un-parks) and the poll loop (which pauses, rewinds and resumes).
type parking struct {
	mu      sync.Mutex
	epoch   int64
	targets map[string]*parkState
	// last is, per target ever parked, the epoch of its last park or resume.
	last map[string]int64
	// paused are the partitions paused for parking.
	paused map[change.Partition]bool
}

func (k *parking) init() {
	if k.targets == nil {
		k.targets, k.last, k.paused = map[string]*parkState{}, map[string]int64{}, map[change.Partition]bool{}
	}
}

// now is the current epoch: what a batch cut now is stamped with.
func (k *parking) now() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.epoch
}

// parked reports whether target is parked (probing included).
func (k *parking) parked(target string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.targets[target]
	return ok
}

// pausedFor reports whether p is paused because its target is parked.
func (k *parking) pausedFor(p change.Partition) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.paused[p]
}

// any reports whether a target is parked.
func (k *parking) any() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.targets) > 0
}

// rules returns, for a batch stamped with epoch, whether a target's part
// must be left out (parked, or parked or resumed after the batch was cut)
// and whether it is a probe (applied on its own).
func (k *parking) rules(epoch int64) (skip, probe func(string) bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	skips, probes := map[string]bool{}, map[string]bool{}
	for t, st := range k.targets {
		if !st.probing || st.inflight || st.done || st.reread {
			skips[t] = true
		} else {
			probes[t] = true
		}
	}
	for t, e := range k.last {
		if epoch < e {
			skips[t] = true
		}
	}
	return func(t string) bool { return skips[t] }, func(t string) bool { return probes[t] && !skips[t] }
}

// parkTarget parks target after err (or parks it again after a probe
// failed, with a longer backoff). Called by the applier and, for
// failures preparing a batch, by the poll loop.
func (c *Consumer) parkTarget(target string, err error) {
	k := &c.park
	k.mu.Lock()
	k.init()
	st := k.targets[target]
	first := st == nil
	if first {
		st = &parkState{since: time.Now()}
		k.targets[target] = st
	}
	limit := parkBackoffMax
	class := c.cfg.Classify(err)
	if class == sink.Blocked || class == sink.Data {
		limit = parkBlockedMax
	}
	switch {
	case st.backoff == 0:
		st.backoff = parkBackoffMin
	default:
		st.backoff = min(2*st.backoff, limit)
	}
	st.err, st.until, st.probing, st.settled, st.inflight, st.done, st.reread = err, time.Now().Add(st.backoff), false, false, false, false, false
	k.epoch++
	k.last[target] = k.epoch
	msg := err.Error()
	logIt := msg != st.logged || time.Since(st.loggedA) > blockedLogEvery
	if logIt {
		st.logged, st.loggedA = msg, time.Now()
	}
	backoff, since := st.backoff, st.since
	k.mu.Unlock()
	state := sink.SQLState(err)
	c.m.Retries.WithLabelValues(state).Inc()
	c.m.TargetBlocked.WithLabelValues(target).Set(1)
	c.health.Wait("target "+target, fmt.Sprintf("target %s parked (its partitions paused, the other targets go on), retrying in %s: %v", target, backoff, err))
	if !logIt {
		return
	}
	fields := []zap.Field{zap.String("target", target), zap.String("sqlstate", state), zap.Duration("retry_in", backoff),
		zap.Duration("parked_for", time.Since(since).Round(time.Second)), zap.Error(err)}
	if class == sink.Blocked || class == sink.Data {
		c.log.Error("progress of this table stopped until this is fixed; the other tables go on (retrying slowly; a fix made live is picked up)",
			append(fields, zap.String("hint", sink.Hint(err)))...)
	} else {
		c.log.Warn("this table is parked while its statements wait (a lock or statement timeout); the other tables go on", fields...)
	}
}

// unpark ends a target's parking after a probe applied its events: what
// other batches held of it was left out meanwhile, so it stays left out
// until the poll loop has read its partitions again from what was applied
// (syncParked, which then ends the parking).
func (c *Consumer) unpark(target string) {
	k := &c.park
	k.mu.Lock()
	defer k.mu.Unlock()
	if st := k.targets[target]; st != nil {
		st.done, st.inflight = true, false
	}
}

// unparked is the end of a parking: its partitions are read again after
// a probe applied, or none of them is assigned any more.
func (c *Consumer) unparked(target string, st *parkState) {
	c.m.TargetBlocked.WithLabelValues(target).Set(0)
	c.health.Wait("target "+target, "")
	msg := "table applied again: parking over"
	if !st.done {
		msg = "parking over: none of the table's partitions is assigned here any more"
	}
	c.log.Info(msg, zap.String("target", target), zap.Duration("parked_for", time.Since(st.since).Round(time.Millisecond)))
}

// syncParked pauses, drops and rewinds the partitions of targets parked
// since the last look, and reads again those whose backoff is over. It
// runs on the poll loop, while no rebalance callback runs.
func (c *Consumer) syncParked() {
	k := &c.park
	k.mu.Lock()
	idle := len(k.targets) == 0 && len(k.paused) == 0
	k.mu.Unlock()
	if idle {
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
	k.mu.Lock()
	now := time.Now()
	hold, resume := map[string]bool{}, map[string]bool{}
	var ended map[string]*parkState
	for t, st := range k.targets {
		switch {
		case !owned[t] && !st.inflight:
			// None of its partitions is assigned any more (revoked,
			// lost): nothing of it was committed past what was applied,
			// and whoever gets them reads from there. A later assignment
			// finds the trouble again, if it lasts.
			k.epoch++
			k.last[t] = k.epoch
			delete(k.targets, t)
			if ended == nil {
				ended = map[string]*parkState{}
			}
			ended[t] = st
		case st.done:
			// A probe applied its events: read the partitions again from
			// what was applied (batches cut before now leave them out),
			// and the parking is over.
			k.epoch++
			k.last[t] = k.epoch
			resume[t] = true
			delete(k.targets, t)
			if ended == nil {
				ended = map[string]*parkState{}
			}
			ended[t] = st
		case st.reread:
			st.reread = false
			k.epoch++
			k.last[t] = k.epoch
			resume[t] = true
		case !st.settled:
			st.settled = true
			hold[t] = true
		case !st.probing && now.After(st.until):
			st.probing = true
			k.epoch++
			k.last[t] = k.epoch
			resume[t] = true
		case !st.probing:
			hold[t] = true // partitions assigned since are paused too
		}
	}
	k.mu.Unlock()
	for t, st := range ended {
		c.unparked(t, st)
	}
	var drop, pause, unpause []change.Partition
	for p := range c.assigned {
		t := c.target(p.Topic)
		k.mu.Lock()
		was := k.paused[p]
		k.mu.Unlock()
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
	k.mu.Lock()
	for _, p := range pause {
		k.paused[p] = true
	}
	for _, p := range unpause {
		delete(k.paused, p)
	}
	k.mu.Unlock()
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
	k := &c.park
	k.mu.Lock()
	var resume []change.Partition
	for _, p := range parts {
		if k.paused[p] {
			delete(k.paused, p)
			resume = append(resume, p)
		}
	}
	k.mu.Unlock()
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
	skip, probe := c.park.rules(j.parkEpoch)
	out := map[string]bool{} // targets whose part is not applied
	var probes []string
	main := j.prepared
	targets := main.Targets()
	if c.park.any() || j.parkEpoch < c.park.now() {
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
		if part != nil && c.park.startProbe(t, j.parkEpoch) {
			c.applier.probe(ctx, j, t, part, nil)
		}
	}
	for _, t := range slices.Sorted(maps.Keys(j.alone)) {
		b := j.alone[t]
		if c.park.startProbe(t, j.parkEpoch) {
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

// startProbe marks a probe of target, from a batch cut at epoch, in
// flight; false if one already is, or the target was parked or read again
// since the batch was cut (while its main part was applied): then the
// part is left out, and the next re-read (due anyway) covers it.
func (k *parking) startProbe(target string, epoch int64) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	st := k.targets[target]
	if st == nil || !st.probing || st.inflight || st.done || st.reread || epoch < k.last[target] {
		if st != nil && st.probing && !st.inflight && !st.done {
			st.reread = true // the part is left out: read again before the next
		}
		return false
	}
	st.inflight = true
	return true
}

// probeDone ends a probe that decided nothing (it applied no event of its
// target, or was abandoned): the target stays probing, and what batches
// held of it while the probe was in flight, left out, is read again
// before any of its parts is applied (syncParked).
func (k *parking) probeDone(target string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st := k.targets[target]; st != nil {
		st.inflight, st.reread = false, true
	}
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
		c.park.probeDone(target)
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
			c.park.probeDone(target)
		case errors.Is(err, errNotMember):
			c.park.probeDone(target)
			c.requestResync(err.Error())
		case err != nil && pctx.Err() != nil:
			// Cut short by a rebalance or a drain: decided nothing.
			c.park.probeDone(target)
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
				c.unpark(target)
			} else {
				c.park.probeDone(target)
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
