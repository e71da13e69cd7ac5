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
	sideT       time.Time // where SetSideMaxT points SideMaxT
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
