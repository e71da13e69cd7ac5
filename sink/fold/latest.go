package fold

import (
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Latest is what the append path needs to know about a key.
type Latest struct {
	V           *Version // latest version by sequence, nil if none
	OpenerSaved bool     // the latest version's opener is in the side table
	SideMaxSeq  change.Seq
	SideMaxT    *time.Time
	// SideRead says SideMaxSeq and SideMaxT were read from the side
	// table with the version (nil: the key has no side rows), also for a
	// key without versions: it need not be asked again.
	SideRead bool
	sideT    time.Time // where SetSideMaxT points SideMaxT
	// PrevAbsent names the columns the key's last after image lacked
	// (dropped at the source, or not added yet): NULL in that image,
	// while V's row may still hold what the version kept from before.
	// A placeholder in the next event takes the image's NULL (DESIGN.md
	// section 5), so the append path starts from V's row with these
	// columns NULL (PrevImage). PrevKnown says PrevAbsent was worked out:
	// by a fold (the append path's next state), or read from the side
	// table for a batch whose events hold placeholders. A state read from
	// the table leaves it unknown otherwise: no other event needs it.
	PrevAbsent []string
	PrevKnown  bool
	// ClosedFrom, when not zero, is a time at or before which none of the
	// key's closed versions ends: known for a key this process saw
	// without any version (NoneClosed) and wrote since. A partitioned
	// table's Type 1 changes then touch only the partitions from there
	// on (zero: unknown, every partition).
	ClosedFrom time.Time
}

// NoneClosed is ClosedFrom for a key without closed versions.
var NoneClosed = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// NoteClosed lowers l's ClosedFrom (when known) to the end of v, if v is
// closed.
func (l *Latest) NoteClosed(v *Version) {
	if !l.ClosedFrom.IsZero() && v.Closed && v.To.Before(l.ClosedFrom) {
		l.ClosedFrom = v.To
	}
}

// PrevImage returns the key's last after image as far as a placeholder
// can tell: V's row with the columns of PrevAbsent NULL, a copy from m
// when there are any (V's row itself when not), nil without a version.
// Every other column of the last image holds V's value: a Type 1 one was
// written to the live version (and kept by the version a delete closed,
// or the one marked deleted after it); a tracked one was equal, or it
// would have opened a version; one the version did not know was learned.
func (l *Latest) PrevImage(s *Shape, m *Mem) []any {
	if l.V == nil {
		return nil
	}
	if len(l.PrevAbsent) == 0 {
		return l.V.Row
	}
	row := m.Row(l.V.Row)
	for _, n := range l.PrevAbsent {
		if i, ok := s.Index[n]; ok {
			row[i] = nil
		}
	}
	return row
}

// LastImage returns the state after evs (sorted by sequence, folded onto
// a state whose last image prev described): the Absent of the last event
// with an after image, known, or prev's when none has one.
func LastImage(evs []Event, prevAbsent []string, prevKnown bool) ([]string, bool) {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Op.HasAfter() {
			return evs[i].Absent, true
		}
	}
	return prevAbsent, prevKnown
}

// MaxSeq is the highest sequence the table knows for the key.
func (l *Latest) MaxSeq() change.Seq {
	m := l.SideMaxSeq
	if l.V != nil {
		if m == nil || l.V.Seq.Compare(m) > 0 {
			m = l.V.Seq
		}
		if l.V.CloseSeq != nil && l.V.CloseSeq.Compare(m) > 0 {
			m = l.V.CloseSeq
		}
	}
	return m
}

// SetSideMaxT points l.SideMaxT at a copy of t that l holds itself.
func (l *Latest) SetSideMaxT(t time.Time) {
	l.sideT = t
	l.SideMaxT = &l.sideT
}
