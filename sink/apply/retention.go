package apply

import (
	"fmt"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// Retention (DESIGN.md section 12; the pass is package maint's Retain)
// removes, per key, the versions closed
// before the horizon (now - retention, and never after the target's
// completeness watermark, so nothing a late event within the reorder
// window needs goes) and the side rows before the first version left,
// and records where it cut in a side row with scd_op 'h' (history's
// horizonOp) at the
// highest sequence it removed. The versions left are a suffix of the
// key's history in sequence order (valid_to grows with the sequence), so
// the invariants verify checks still hold.
//
// A re-fold of such a key starts at the first event left, taken as
// resolved (its stored time and row are the state the removed events
// left), and drops the late events before it, counted per target in
// Result.Expired and never dead-lettered: what they could change is gone. The horizon
// row's sequence is the highest removed, a truncate's closing one too, so
// that such an event never takes the append path either. A current version is never removed;
// a key whose every version was closed before the horizon keeps only its
// horizon row and the side rows after it.

// afterHorizon reports whether an event at seq comes after what
// retention removed: past the horizon and not before the first event
// left (first; nil when none is left).
func afterHorizon(seq, horizon, first change.Seq) bool {
	if first != nil {
		return seq.Compare(first) >= 0
	}
	return seq.Compare(horizon) > 0
}

// expiredOf returns the events of evs after the horizon, and the
// others described as dead letters of reason ReasonExpired, for
// Applier.Table to count (Result.Expired) and log, never to store: what
// they would change is gone.
func expiredOf(t *plan.Table, evs []fold.Event, horizon, first change.Seq) ([]fold.Event, []plan.DeadLetter) {
	var out []fold.Event
	var dead []plan.DeadLetter
	for _, e := range evs {
		if afterHorizon(e.Seq, horizon, first) {
			out = append(out, e)
		} else {
			dead = append(dead, plan.EventDeadLetter(e.Src, plan.ReasonExpired, fmt.Errorf(
				"expired: the event (sequence %s) comes before what retention kept of its key in %s (removed through sequence %s); the versions it would change are gone",
				e.Seq, t.Hist.Sanitize(), horizon)))
		}
	}
	return out, dead
}
