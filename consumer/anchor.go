package consumer

import (
	"github.com/scd2sink/scd2sink/internal/change"
)

// anchors orders snapshot reads that carry no sequence (Debezium's
// incremental snapshots) after everything before them in their partition:
// such a read gets the highest sequence of the partition's earlier records,
// extended by its own offset. That sorts after every earlier event of its
// key (a key lives in one partition) and before any later one with a higher
// sequence, and it is the same however often the partition is replayed:
// from the start it is recomputed, and from a commit point it resumes from
// the anchor recorded with that offset (scd2sink_offsets.anchor_seq).
// Guarded by Consumer.mu.
type anchors struct {
	parts map[change.Partition]*anchorState
}

type anchorState struct {
	max   change.Seq
	marks []anchorMark // where max grew, in offset order
	// seqs holds copies of the marks' sequences, a slab at a time: a
	// mark must not keep its event's memory alive (an event's sequence
	// shares an allocation with its row image), and marks go in order.
	seqs change.Boxes
}

// anchorMark: the highest sequence of the records below offset.
type anchorMark struct {
	offset int64
	max    change.Seq
}

func newAnchors() *anchors { return &anchors{parts: map[change.Partition]*anchorState{}} }

func (a *anchors) state(p change.Partition) *anchorState {
	st := a.parts[p]
	if st == nil {
		st = &anchorState{}
		a.parts[p] = st
	}
	return st
}

// see records an event's sequence, read in offset order.
func (a *anchors) see(o change.Origin, seq change.Seq) {
	st := a.state(o.Partition)
	if st.max == nil || seq.Compare(st.max) > 0 {
		st.max = seq
		if len(seq) > 0 {
			st.max = change.Seq(st.seqs.CopyBytes(seq))
		}
		st.marks = append(st.marks, anchorMark{offset: o.Offset + 1, max: st.max})
	}
}

// anchor returns the sequence of a read without one at o.
func (a *anchors) anchor(o change.Origin) change.Seq {
	st := a.state(o.Partition)
	out := make(change.Seq, 0, len(st.max)+10)
	if st.max == nil {
		out = change.AppendSeqNull(out) // nothing before it in the partition
	} else {
		out = append(out, st.max...)
	}
	return change.AppendSeqInt(out, o.Offset)
}

// resume seeds a partition resumed at offset with its recorded anchor.
func (a *anchors) resume(p change.Partition, offset int64, seq change.Seq) {
	a.parts[p] = &anchorState{max: seq, marks: []anchorMark{{offset: offset, max: seq}}}
}

// at returns the anchors of the commit points: per partition, the highest
// sequence of the records below its offset (none when unknown), and forgets
// marks no later commit point needs.
func (a *anchors) at(offsets map[change.Partition]int64) map[change.Partition]change.Seq {
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
			out[p] = st.marks[i].max
			st.marks = st.marks[i:]
		}
	}
	return out
}

// drop forgets partitions given up.
func (a *anchors) drop(parts []change.Partition) {
	for _, p := range parts {
		delete(a.parts, p)
	}
}
