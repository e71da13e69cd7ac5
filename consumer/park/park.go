// Package park keeps the targets a consumer parked: one table's trouble
// stays in its table (DESIGN.md section 6).
//
// A failure that belongs to one target (sink.ParkTarget: a lock or
// statement timeout, a table changed by hand, a missing privilege,
// schema_changes: fail, a value isolation could not resolve) parks that
// target: the batch is applied again without it, so every other target
// goes on applying and committing, and the target's partitions are paused,
// their buffered events dropped and their reading position put back to
// what was applied of them. Nothing of a parked target is committed past
// what was applied. After a backoff (backoffMin doubling to backoffMax,
// blockedMax for blocked errors) its partitions are read again from
// there, and the first batches holding its events are prepared (its DDL
// too: a column added while a DBA holds the table) and applied in
// transactions of their own, on a goroutine of their own (a probe), so
// that a trouble that lasts costs the others nothing; the first probe
// that applies its events un-parks it. The consumer (its park.go) does
// the pausing, dropping, re-reading and probing; Parking decides when.
//
// Which part of a batch may be applied is decided by epochs: every park
// and every resume of a target takes the next epoch, and each batch is
// stamped with the epoch at which its events were taken. A target's part
// of a batch cut before its last park or resume is never applied: its
// events may follow events that were dropped, and they are read again.
//
// Invariants: a parked target has at most one probe in flight; while one
// is, and after a probe ended until the poll loop read the target's
// partitions again (Sync), every part of it is left out; a target's
// parking ends only on the poll loop (Sync), once a probe applied its
// events or none of its partitions is assigned any more.
//
// The state kept is enough: per parked target, its backoff, its phase
// (settled, probing, a probe in flight, done, to be read again) and what
// was last logged of it; per target ever parked, the epoch of its last
// park or resume, which is all Rules and StartProbe need to tell a stale
// part of a batch; and the partitions paused for parking, so that exactly
// those are resumed. What was applied of a partition is the consumer's to
// keep (its offsets), not this package's.
package park

import (
	"sync"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Backoff of a parked target.
var (
	backoffMin = time.Second
	backoffMax = 10 * time.Second // lock and statement timeouts
	blockedMax = 30 * time.Second // a table changed by hand, a missing grant
)

// state is one parked target.
type state struct {
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

// Parking is the parked targets, shared by the applier (which parks and
// un-parks) and the poll loop (which pauses, rewinds and resumes). Its
// zero value has no target parked; it is safe for concurrent use.
type Parking struct {
	mu      sync.Mutex
	epoch   int64
	targets map[string]*state
	// last is, per target ever parked, the epoch of its last park or resume.
	last map[string]int64
	// paused are the partitions paused for parking.
	paused map[change.Partition]bool
}

func (k *Parking) init() {
	if k.targets == nil {
		k.targets, k.last, k.paused = map[string]*state{}, map[string]int64{}, map[change.Partition]bool{}
	}
}

// Now is the current epoch: what a batch cut now is stamped with.
func (k *Parking) Now() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.epoch
}

// Parked reports whether target is parked (probing included).
func (k *Parking) Parked(target string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.targets[target]
	return ok
}

// PausedFor reports whether p is paused because its target is parked.
func (k *Parking) PausedFor(p change.Partition) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.paused[p]
}

// Any reports whether a target is parked.
func (k *Parking) Any() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.targets) > 0
}

// Idle reports whether no target is parked and no partition is paused
// for one: Sync has nothing to do.
func (k *Parking) Idle() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.targets) == 0 && len(k.paused) == 0
}

// Rules returns, for a batch stamped with epoch, whether a target's part
// must be left out (parked, or parked or resumed after the batch was cut)
// and whether it is a probe (applied on its own).
func (k *Parking) Rules(epoch int64) (skip, probe func(string) bool) {
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

// Parked is what Park did.
type Parked struct {
	// Backoff is how long until the target's partitions are read again.
	Backoff time.Duration
	// Since is when the target was first parked (not parked again).
	Since time.Time
	// Log is set when this trouble is to be logged: its message differs
	// from the last one logged, or that was logged longer than logEvery
	// ago.
	Log bool
}

// Park parks target after err (or parks it again after a probe failed,
// with a longer backoff: up to blockedMax when blocked, a table changed
// by hand or a value in error, else backoffMax), and takes the next
// epoch.
func (k *Parking) Park(target string, err error, blocked bool, logEvery time.Duration) Parked {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.init()
	st := k.targets[target]
	if st == nil {
		st = &state{since: time.Now()}
		k.targets[target] = st
	}
	limit := backoffMax
	if blocked {
		limit = blockedMax
	}
	switch {
	case st.backoff == 0:
		st.backoff = backoffMin
	default:
		st.backoff = min(2*st.backoff, limit)
	}
	st.err, st.until, st.probing, st.settled, st.inflight, st.done, st.reread = err, time.Now().Add(st.backoff), false, false, false, false, false
	k.epoch++
	k.last[target] = k.epoch
	msg := err.Error()
	logIt := msg != st.logged || time.Since(st.loggedA) > logEvery
	if logIt {
		st.logged, st.loggedA = msg, time.Now()
	}
	return Parked{Backoff: st.backoff, Since: st.since, Log: logIt}
}

// Unpark ends a target's parking after a probe applied its events: what
// other batches held of it was left out meanwhile, so it stays left out
// until the poll loop has read its partitions again from what was applied
// (Sync, which then ends the parking).
func (k *Parking) Unpark(target string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st := k.targets[target]; st != nil {
		st.done, st.inflight = true, false
	}
}

// StartProbe marks a probe of target, from a batch cut at epoch, in
// flight; false if one already is, or the target was parked or read again
// since the batch was cut (while its main part was applied): then the
// part is left out, and the next re-read (due anyway) covers it.
func (k *Parking) StartProbe(target string, epoch int64) bool {
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

// ProbeDone ends a probe that decided nothing (it applied no event of its
// target, or was abandoned): the target stays probing, and what batches
// held of it while the probe was in flight, left out, is read again
// before any of its parts is applied (Sync).
func (k *Parking) ProbeDone(target string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st := k.targets[target]; st != nil {
		st.inflight, st.reread = false, true
	}
}

// Ended is a parking that ended.
type Ended struct {
	// Since is when the target was parked.
	Since time.Time
	// Applied is set when a probe applied its events; else none of its
	// partitions is assigned any more.
	Applied bool
}

// Sync moves the parked targets on, on the poll loop, given the targets
// of the partitions assigned (owned): it returns the targets whose
// partitions are to be paused and dropped (hold: parked since the last
// look, or partitions assigned since), those whose partitions are to be
// read again from what was applied (resume: the backoff is over, a probe
// applied, or a probe ended without deciding), and the parkings that
// ended, by target. The caller reads again what it resumes before any
// batch is cut: a new epoch is taken for each.
func (k *Parking) Sync(owned map[string]bool) (hold, resume map[string]bool, ended map[string]Ended) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now()
	hold, resume = map[string]bool{}, map[string]bool{}
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
				ended = map[string]Ended{}
			}
			ended[t] = Ended{Since: st.since, Applied: st.done}
		case st.done:
			// A probe applied its events: read the partitions again from
			// what was applied (batches cut before now leave them out),
			// and the parking is over.
			k.epoch++
			k.last[t] = k.epoch
			resume[t] = true
			delete(k.targets, t)
			if ended == nil {
				ended = map[string]Ended{}
			}
			ended[t] = Ended{Since: st.since, Applied: st.done}
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
	return hold, resume, ended
}

// SetPaused records partitions paused for parking (pause) and those
// resumed (unpause).
func (k *Parking) SetPaused(pause, unpause []change.Partition) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.init()
	for _, p := range pause {
		k.paused[p] = true
	}
	for _, p := range unpause {
		delete(k.paused, p)
	}
}

// Release forgets partitions given up (revoked, lost) and returns those
// of them that were paused for parking: the caller resumes them for a
// later assignment (which pauses them again while their target is
// parked).
func (k *Parking) Release(parts []change.Partition) []change.Partition {
	k.mu.Lock()
	defer k.mu.Unlock()
	var resume []change.Partition
	for _, p := range parts {
		if k.paused[p] {
			delete(k.paused, p)
			resume = append(resume, p)
		}
	}
	return resume
}
