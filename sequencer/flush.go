package sequencer

import "github.com/scd2sink/scd2sink/internal/change"

// Flush hands out everything buffered (at shutdown), except a
// primary-key change's create still waiting for its old key (see
// flushKey): the commit point stays before it, and the next start reads
// it again.
func (s *Sequencer) Flush() Output {
	out := s.takeReady()
	now := s.now().UnixNano()
	for _, kb := range s.sortedKeys() {
		s.flushKey(kb, &out, func(item) bool { return true }, now)
	}
	return out
}

// FlushPartitions hands out every buffered event that came from one of
// parts (before those partitions are revoked), except, as Flush, a
// primary-key change's create still waiting for its old key: it is left
// to the partition's next owner.
func (s *Sequencer) FlushPartitions(parts []change.Partition) Output {
	set := partSet(parts)
	out := s.takeReady()
	now := s.now().UnixNano()
	for _, kb := range s.sortedKeys() {
		s.flushKey(kb, &out, func(it item) bool { return set[it.ev.Origin.Partition] }, now)
	}
	return out
}

// flushKey releases the items of kb that take selects, in sequence order,
// up to a create of a primary-key change that still waits for its old
// key's delete: that delete is released with it when it is buffered here
// (in any partition); when it is not, the create and the key's events
// after it stay buffered. Released now, the create would take NULL for
// its unavailable values when the old key's partition is behind (it is
// read here more slowly, or by another member); left buffered, it holds
// its partition's commit point, so the next reader (this member after a
// restart, or the partition's next owner) waits for the old key again
// (DESIGN.md section 5: the create waits, the placeholder is never
// stored).
func (s *Sequencer) flushKey(kb *keyBuf, out *Output, take func(item) bool, now int64) {
	var upto change.Seq
	for _, it := range kb.items {
		if take(it) && (upto == nil || it.ev.Seq.Compare(upto) > 0) {
			upto = it.ev.Seq
		}
	}
	if upto == nil {
		return
	}
	held := s.gated(kb, upto, now)
	if held != nil && s.releaseOldKey(kb.ref.table, held.it.ev, out, now, 0) {
		held = s.gated(kb, upto, now)
	}
	if held != nil {
		if held.before == nil {
			return
		}
		upto = held.before
	}
	s.releaseKey(kb, out, func(it item) bool { return take(it) && it.ev.Seq.Compare(upto) <= 0 })
}

// DropPartitions forgets every buffered event of parts without handing it
// out, and their commit points (after those partitions were lost).
func (s *Sequencer) DropPartitions(parts []change.Partition) {
	set := partSet(parts)
	for ref, kb := range s.keys {
		kept := kb.items[:0]
		for _, it := range kb.items {
			if set[it.ev.Origin.Partition] {
				s.n--
				s.bytes -= it.size
			} else {
				kept = append(kept, it)
			}
		}
		clear(kb.items[len(kept):]) // no dropped event kept alive
		kb.items = kept
		s.reschedule(ref, kb)
	}
	keep := func(ev *change.Event) bool { return !set[ev.Origin.Partition] }
	s.ready.Events = filter(s.ready.Events, keep)
	var cs []Conflict
	for _, c := range s.ready.Conflicts {
		if keep(c.Event) {
			cs = append(cs, c)
		}
	}
	s.ready.Conflicts = cs
	for _, p := range parts {
		delete(s.parts, p)
	}
}

func partSet(parts []change.Partition) map[change.Partition]bool {
	set := make(map[change.Partition]bool, len(parts))
	for _, p := range parts {
		set[p] = true
	}
	return set
}

func filter(evs []*change.Event, keep func(*change.Event) bool) []*change.Event {
	var out []*change.Event
	for _, ev := range evs {
		if keep(ev) {
			out = append(out, ev)
		}
	}
	return out
}
