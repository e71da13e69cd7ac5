package apply

import (
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// DeadNote is what a batch's transaction wrote of one dead letter: the
// consumer logs and counts it once the transaction has committed.
type DeadNote struct {
	Origin change.Origin
	Table  string
	Reason string
	Err    string
}

// Result counts what one Apply did.
type Result struct {
	Events         int // events folded into history
	Duplicates     int // already applied, dropped
	DeadLetters    int // written to the dead-letter table
	VersionsOpened int
	VersionsClosed int
	Repaired       int // keys whose history was re-folded because of late events
	// RepairVersionsRead and RepairSideRowsRead count what those repairs
	// read of the history table and of the side table (the part of a key's
	// history a late event can change, docs/benchmarks.md).
	RepairVersionsRead int
	RepairSideRowsRead int
	// TypeMismatches counts dead letters whose value no longer fits its
	// column's type; Rejected those PostgreSQL refused. Both are among
	// DeadLetters.
	TypeMismatches int
	Rejected       int
	// Dead are the dead letters written, as DeadLetters counts them.
	Dead []DeadNote
	// Disagreements counts, per target, the late events whose valid time
	// is after that of an event their sequence puts after them (a
	// sequence that runs backwards, as binlog positions do across a MySQL
	// failover); Disagree holds the first maxDisagreeNotes of them.
	Disagreements map[string]int
	Disagree      []Disagreement
	// Erased counts, per target, the events and dead letters of erased
	// keys dropped (package erasure).
	Erased map[string]int
	// Expired counts, per target, the events whose whole effect lies
	// before what retention left of their key's history (retention.go):
	// dropped and counted, never dead-lettered; ExpiredNotes holds the
	// first maxDisagreeNotes of them, for a log at a bounded rate.
	Expired      map[string]int
	ExpiredNotes []DeadNote
}

// noteExpired counts an event of target dropped as expired (l describes it).
func (r *Result) noteExpired(target string, l plan.DeadLetter) {
	if r.Expired == nil {
		r.Expired = map[string]int{}
	}
	r.Expired[target]++
	if len(r.ExpiredNotes) < maxDisagreeNotes {
		r.ExpiredNotes = append(r.ExpiredNotes, DeadNote{Origin: l.Origin, Table: target, Reason: plan.ReasonExpired, Err: l.Err})
	}
}

// Disagreement is a pair of a key's events that its sequence and their
// valid times order differently: the event at Seq comes first by sequence
// but its time T is after LaterT, the time of the event at Later. The fold
// follows the sequence (DESIGN.md section 5, clamping the later event's
// time), which is right when a clock stepped back and wrong when the
// sequence ran backwards — binlog positions compared across a failover —
// and then the history is repaired into the past: it is logged and
// counted, never silent (docs/sources.md). Origin is the record of the
// pair that the batch brought.
type Disagreement struct {
	Origin change.Origin
	Table  string
	Seq    change.Seq
	T      time.Time
	Later  change.Seq
	LaterT time.Time
}

// maxDisagreeNotes bounds the disagreements one batch reports in full.
const maxDisagreeNotes = 20

// noteDisagreements walks a key's events in sequence order (after start,
// the time of what the table holds before them, zero when nothing, set by
// the event at startSeq) and
// counts each event whose valid time is before an earlier event's where
// one of the two is new in this batch. Snapshot reads take no part: their
// time is when the snapshot read them, not when the row changed; nor do
// events whose time stands in for a column they lack (TimeStandIn). A
// pair is noted in full only when both sequences are known: a note names
// the events it is about, or is not written (the count still holds it).
func (r *Result) noteDisagreements(table string, evs []fold.Event, start time.Time, startSeq change.Seq) {
	prev, prevSeq := start, startSeq
	var holder *fold.Event // the event that set prev; nil: the table
	for i := range evs {
		e := &evs[i]
		if e.Op == change.OpTruncate || e.Op == change.OpRead || (e.Src != nil && e.Src.TimeStandIn) {
			continue
		}
		in := e.T
		if !e.Raw.IsZero() && !e.Resolved {
			in = e.Raw
		}
		if in.Before(prev) && (e.Src != nil || (holder != nil && holder.Src != nil)) {
			if r.Disagreements == nil {
				r.Disagreements = map[string]int{}
			}
			r.Disagreements[table]++
			if len(r.Disagree) < maxDisagreeNotes && len(prevSeq) > 0 && len(e.Seq) > 0 {
				d := Disagreement{Table: table, T: prev, Seq: prevSeq, Later: e.Seq, LaterT: in}
				if e.Src != nil {
					d.Origin = e.Src.Origin
				} else {
					d.Origin = holder.Src.Origin
				}
				r.Disagree = append(r.Disagree, d)
			}
		}
		if in.After(prev) {
			prev, prevSeq, holder = in, e.Seq, e
		}
	}
}

// Add adds o's counts and notes to r's.
func (r *Result) Add(o Result) {
	r.Events += o.Events
	r.Duplicates += o.Duplicates
	r.DeadLetters += o.DeadLetters
	r.VersionsOpened += o.VersionsOpened
	r.VersionsClosed += o.VersionsClosed
	r.Repaired += o.Repaired
	r.RepairVersionsRead += o.RepairVersionsRead
	r.RepairSideRowsRead += o.RepairSideRowsRead
	r.TypeMismatches += o.TypeMismatches
	r.Rejected += o.Rejected
	for t, n := range o.Expired {
		if r.Expired == nil {
			r.Expired = map[string]int{}
		}
		r.Expired[t] += n
	}
	if n := maxDisagreeNotes - len(r.ExpiredNotes); n > 0 {
		r.ExpiredNotes = append(r.ExpiredNotes, o.ExpiredNotes[:min(n, len(o.ExpiredNotes))]...)
	}
	r.Dead = append(r.Dead, o.Dead...)
	for t, n := range o.Erased {
		if r.Erased == nil {
			r.Erased = map[string]int{}
		}
		r.Erased[t] += n
	}
	for t, n := range o.Disagreements {
		if r.Disagreements == nil {
			r.Disagreements = map[string]int{}
		}
		r.Disagreements[t] += n
	}
	if n := maxDisagreeNotes - len(r.Disagree); n > 0 {
		r.Disagree = append(r.Disagree, o.Disagree[:min(n, len(o.Disagree))]...)
	}
}
