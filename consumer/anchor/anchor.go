// Package anchor gives the snapshot reads that carry no sequence
// (Debezium's incremental snapshots) a sequence of their own, their
// anchor: the highest sequence of the earlier records of their partition,
// extended by their own offset (Anchors).
//
// Invariants: an anchor sorts after every earlier event of its key and
// before any later one with a higher sequence, and a partition read again
// gives every read the same anchor, whether it is read from the start or
// resumed from a commit point with the anchor recorded there (Resume; At
// gives what to record with each commit point).
//
// The state kept is enough: per partition, only the offsets where the
// highest sequence grew, with those sequences, and only from the last
// commit point's on (At forgets the marks before it): an anchor needs the
// highest sequence below its offset, and a later commit point the highest
// below its own.
package anchor

import (
	"bytes"
	"slices"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Anchors orders snapshot reads that carry no sequence (Debezium's
// incremental snapshots) after everything before them in their partition:
// such a read gets the highest sequence of the partition's earlier records,
// extended by its own offset. That sorts after every earlier event of its
// key (a key lives in one partition) and before any later one with a higher
// sequence, and it is the same however often the partition is replayed:
// from the start it is recomputed, and from a commit point it resumes from
// the anchor recorded with that offset (scd2sink_offsets.anchor_seq).
// Not safe for concurrent use: the consumer guards it with its mutex
// (Consumer.mu).
type Anchors struct {
	parts map[change.Partition]*anchorState
}

type anchorState struct {
	max   change.Seq   // the highest sequence seen: the last mark's, in arena
	marks []anchorMark // where max grew, in offset order
	// arena holds the marks' sequences, in order: a mark must not keep
	// its event's memory alive (an event's sequence shares an allocation
	// with its row image), and marks without pointers are not traced by
	// the collector (a mark per event under a rising sequence).
	arena []byte
}

// anchorMark: the highest sequence of the records below offset is
// arena[at:at+n] (nil when n is -1).
type anchorMark struct {
	offset int64
	at, n  int32
}

// New returns Anchors that know no partition.
func New() *Anchors { return &Anchors{parts: map[change.Partition]*anchorState{}} }

func (a *Anchors) state(p change.Partition) *anchorState {
	st := a.parts[p]
	if st == nil {
		st = &anchorState{}
		a.parts[p] = st
	}
	return st
}

// See records an event's sequence, read in offset order.
func (a *Anchors) See(o change.Origin, seq change.Seq) {
	st := a.state(o.Partition)
	if st.max == nil || seq.Compare(st.max) > 0 {
		st.mark(o.Offset+1, seq)
	}
}

// mark records seq as the highest below offset.
func (st *anchorState) mark(offset int64, seq change.Seq) {
	m := anchorMark{offset: offset, at: int32(len(st.arena)), n: -1}
	if seq != nil {
		st.arena = append(st.arena, seq...)
		m.n = int32(len(seq))
	}
	st.marks = append(st.marks, m)
	st.max = st.seq(m)
}

// seq returns a mark's sequence, a view of the arena.
func (st *anchorState) seq(m anchorMark) change.Seq {
	if m.n < 0 {
		return nil
	}
	end := int(m.at) + int(m.n)
	return change.Seq(st.arena[m.at:end:end])
}

// Anchor returns the sequence of a read without one at o.
func (a *Anchors) Anchor(o change.Origin) change.Seq {
	st := a.state(o.Partition)
	out := make(change.Seq, 0, len(st.max)+10)
	if st.max == nil {
		out = change.AppendSeqNull(out) // nothing before it in the partition
	} else {
		out = append(out, st.max...)
	}
	return change.AppendSeqInt(out, o.Offset)
}

// Resume seeds a partition resumed at offset with its recorded anchor.
func (a *Anchors) Resume(p change.Partition, offset int64, seq change.Seq) {
	st := &anchorState{}
	st.mark(offset, seq)
	a.parts[p] = st
}

// At returns the anchors of the commit points: per partition, the highest
// sequence of the records below its offset (none when unknown), and forgets
// marks no later commit point needs.
func (a *Anchors) At(offsets map[change.Partition]int64) map[change.Partition]change.Seq {
	out := map[change.Partition]change.Seq{}
	for p, off := range offsets {
		st := a.parts[p]
		if st == nil {
			continue
		}
		i := -1
		for j, m := range st.marks {
			if m.offset <= off {
				i = j
			}
		}
		if i >= 0 {
			out[p] = bytes.Clone(st.seq(st.marks[i])) // the arena is compacted in place
			st.forget(i)
		}
	}
	return out
}

// forget drops the marks before marks[i], compacting the marks and, once
// they hold less than half of it, the arena.
func (st *anchorState) forget(i int) {
	if cap(st.marks) > 4096 && len(st.marks)-i < cap(st.marks)/8 {
		st.marks = slices.Clone(st.marks[i:])
	} else {
		st.marks = append(st.marks[:0], st.marks[i:]...)
	}
	base := st.marks[0].at
	if int(base) < len(st.arena)/2 {
		return
	}
	live := st.arena[base:]
	if cap(st.arena) > 64<<10 && len(live) < cap(st.arena)/8 {
		st.arena = bytes.Clone(live) // a burst is over: give its room back
	} else {
		st.arena = append(st.arena[:0], live...)
	}
	for j := range st.marks {
		st.marks[j].at -= base
	}
	st.max = st.seq(st.marks[len(st.marks)-1])
}

// Drop forgets partitions given up.
func (a *Anchors) Drop(parts []change.Partition) {
	for _, p := range parts {
		delete(a.parts, p)
	}
}
