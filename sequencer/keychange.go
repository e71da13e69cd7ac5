package sequencer

import (
	"slices"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// A primary-key change is a delete of the old key and a create of the new
// one (Event.OldKey), in one source transaction but possibly in different
// partitions. The sink resolves the create's unavailable-value placeholders
// from the old key's history, so the create waits, at most KeyChangeWait,
// until the old key's delete has been released before it. After a
// restart the delete may have been applied already and is never seen: the
// wait then runs out and the sink finds the old key in the table.
//
// Debezium gives the delete and the create the same sequence (one WAL
// record): within a key change the delete counts as before the create
// (DESIGN.md section 5). When the create is due and the old key's delete
// is buffered, the old key's events up to the delete are released with it,
// ahead of it in the same output, so a key change costs no more latency
// than any other event.

// gateStep is how often a waiting create looks again.
const gateStep = 50 * time.Millisecond

// maxKeyEnds bounds the memory of released primary-key deletes.
const maxKeyEnds = 100_000

// heldItem is the first event of a key that must wait, and the highest
// sequence that may be released before it (nil: none).
type heldItem struct {
	it     *item
	before change.Seq
}

// gated returns the first waiting create among kb's events up to upto.
func (s *Sequencer) gated(kb *keyBuf, upto change.Seq, now int64) *heldItem {
	if upto == nil || !slices.ContainsFunc(kb.items, func(it item) bool { return it.gate != 0 }) {
		return nil // the common case: no primary-key change waits in this key
	}
	var buf [8]int
	idx := buf[:0]
	for i := range kb.items {
		if kb.items[i].ev.Seq.Compare(upto) <= 0 {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(a, b int) int { return kb.items[a].ev.Seq.Compare(kb.items[b].ev.Seq) })
	var before change.Seq
	for _, i := range idx {
		it := &kb.items[i]
		if it.gate != 0 && now < it.gate && !s.oldKeyEnded(kb.ref.table, it.ev) {
			return &heldItem{it: it, before: before}
		}
		before = it.ev.Seq
	}
	return nil
}

// postpone makes the waiting create, and the events of its key after it, due
// again at its next look.
func (s *Sequencer) postpone(kb *keyBuf, h *heldItem, now int64) {
	at := min(h.it.gate, now+int64(gateStep))
	seq := h.it.ev.Seq
	for i := range kb.items {
		if kb.items[i].ev.Seq.Compare(seq) >= 0 {
			kb.items[i].deadline = max(kb.items[i].deadline, at)
		}
	}
}

// oldKeyEnded reports whether the delete of ev's old key, before ev or at
// its sequence, has been released (in an earlier Release, or earlier in
// this one's output: a batch applied before ev's, or ev's own).
func (s *Sequencer) oldKeyEnded(table string, ev *change.Event) bool {
	seq, ok := s.keyEnds[keyRef{table, change.KeyID(ev.OldKey)}]
	return ok && seq.Compare(ev.Seq) <= 0
}

// releaseOldKey releases, into out, the buffered events of the waiting
// create's old key up to its primary-key delete, when that delete is
// buffered at or before the create's sequence. It reports whether it did.
// In a chain of key changes (A→B, then B→C) the old key's own creating
// event may itself wait for its old key: that one is released first, the
// same way, or nothing is (depth bounds the chain followed).
func (s *Sequencer) releaseOldKey(table string, create *change.Event, out *Output, now int64, depth int) bool {
	old := s.keys[keyRef{table, change.KeyID(create.OldKey)}]
	if old == nil || old.ref.key == create.KeyID() || depth > maxKeyChain {
		return false
	}
	var end change.Seq
	for _, it := range old.items {
		if it.ev.KeyChanged && it.ev.Op == change.OpDelete && it.ev.Seq.Compare(create.Seq) <= 0 &&
			(end == nil || it.ev.Seq.Compare(end) > 0) {
			end = it.ev.Seq
		}
	}
	if end == nil {
		return false
	}
	if held := s.gated(old, end, now); held != nil {
		if !s.releaseOldKey(table, held.it.ev, out, now, depth+1) || s.gated(old, end, now) != nil {
			return false
		}
	}
	s.releaseKey(old, out, func(it item) bool { return it.ev.Seq.Compare(end) <= 0 })
	return true
}

// maxKeyChain bounds the chain of key changes releaseOldKey follows.
const maxKeyChain = 8

// noteKeyChange remembers a released primary-key delete, and forgets the
// old key's entry once its create is released.
func (s *Sequencer) noteKeyChange(ref keyRef, ev *change.Event) {
	switch {
	case ev.KeyChanged && ev.Op == change.OpDelete:
		if len(s.keyEnds) >= maxKeyEnds {
			clear(s.keyEnds)
		}
		if cur, ok := s.keyEnds[ref]; !ok || ev.Seq.Compare(cur) > 0 {
			s.keyEnds[ref] = ev.Seq
		}
	case ev.OldKey != nil:
		delete(s.keyEnds, keyRef{ref.table, change.KeyID(ev.OldKey)})
	}
}

// opensKey reports whether kb holds the create of a primary-key change:
// flushed after the other keys, so that its old key's events come first.
func (kb *keyBuf) opensKey() bool {
	for _, it := range kb.items {
		if it.gate != 0 {
			return true
		}
	}
	return false
}
