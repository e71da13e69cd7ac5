// Package sequencer is scd2sink's per-key reorder buffer.
//
// Events wait up to the reorder window for earlier events of the same key and
// are released in sequence order. When any event of a key is due, every
// buffered event of that key up to the due one's sequence is released with
// it, so a key's released events always come out sorted. Exact duplicates
// (same key, sequence and content) inside the buffer are dropped; a second
// event with the same key and sequence but other content is a conflict and is
// released as a dead letter (the first one wins).
//
// The sequencer also tracks, per Kafka partition, the commit point: the
// lowest offset whose event has not been released yet (or one past the
// highest offset seen when nothing is held). Everything below it has been
// handed out by Release, Flush or FlushPartitions, or needed no apply.
//
// Memory is bounded twice. MaxBufferedEvents is back-pressure: above it
// Full tells the caller to stop fetching. MaxBufferedBytes bounds what the
// buffer holds while fetching goes on: above it, Release hands out the
// keys whose events are due soonest before their window ends, as if the
// clock had reached their deadline, until the buffer is back under it. In a
// backlog read faster than PostgreSQL takes it, the window thus shrinks to
// what the budget holds instead of the buffer growing to rate × window.
// History stays exact: an event of such a key that arrives later with a
// lower sequence is repaired by the sink, like any late event; only its
// cost differs. The create of a primary-key change is the exception: it
// waits for its old key's delete on the real clock (keychange.go), budget
// or not, and with it its key's later events; the bound is then exceeded
// by those for at most KeyChangeWait.
//
// A Sequencer is not safe for concurrent use; one goroutine owns it.
package sequencer

import (
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
	"unsafe"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Config bounds the buffer.
type Config struct {
	// ReorderWindow is how long an event may wait for earlier events of its key.
	ReorderWindow time.Duration
	// MaxBufferedEvents is the size above which Full reports true and the
	// caller should pause fetching.
	MaxBufferedEvents int
	// MaxBufferedBytes bounds the estimated memory of the buffered events
	// (change.Event.Size, with the buffer's own books per event and per
	// key: itemOverhead, keyBuf.size); 0 means no bound. See the package
	// comment.
	MaxBufferedBytes int64
	// KeyChangeWait is how long the create of a primary-key change (an
	// event with OldKey) waits, at most, for the delete of its old key to
	// be released first (default 10 × ReorderWindow, at least 5s). See
	// keychange.go.
	KeyChangeWait time.Duration
}

// Conflict is an event rejected because another event of its key with the
// same sequence but different content was accepted first.
type Conflict struct {
	Event *change.Event
	Err   error
}

// Output is what one Release, Flush or FlushPartitions hands out.
type Output struct {
	// Events are ready to apply, grouped by key and sorted by sequence within a key.
	Events []*change.Event
	// Conflicts are to be written to the dead-letter table.
	Conflicts []Conflict
}

// Len returns the number of items in the output.
func (o Output) Len() int { return len(o.Events) + len(o.Conflicts) }

// Stats counts what the sequencer did since it was created.
type Stats struct {
	Duplicates int64
	Conflicts  int64
	Released   int64
	// ReleasedEarly counts the events released before their window ended
	// because the buffer was over MaxBufferedBytes.
	ReleasedEarly int64
	// ReleasedQuiet counts the events released before their window ended
	// because the input was quiet (ReleaseQuiet).
	ReleasedQuiet int64
}

type keyRef struct {
	table string
	key   string
}

type item struct {
	ev       *change.Event
	deadline int64  // unix nanoseconds: compact, for large buffers
	gate     int64  // a primary-key change's create: wait for the old key until then
	size     int64  // ev.Size() when added
	seqTag   uint64 // a digest of ev.Seq: repeats are looked for without reading the events
}

// seqTag digests a sequence for item.seqTag.
func seqTag(seq change.Seq) uint64 { return maphash.Bytes(seqSeed, seq) }

var seqSeed = maphash.MakeSeed()

type keyBuf struct {
	ref       keyRef
	items     []item // arrival order; starts in first
	scheduled int64
	gone      bool    // out of Sequencer.keys (for good): its heap entries are stale
	first     [1]item // most keys wait with one event: no second allocation
}

// The buffer's own books, counted in its byte budget with the events'
// sizes (TestBudgetCountsMemory checks the sum against the heap):
//   - itemOverhead, per event: its item, its offset held for the commit
//     point, and its share of the deadline heap and of slices' spare room;
//   - per key, keyBuf.size: the key's buffer, its map slot and the copy of
//     its identity.
const (
	itemOverhead   = int64(unsafe.Sizeof(item{})) + 24
	keyBufOverhead = int64(unsafe.Sizeof(keyBuf{})) + 64
)

// size is what the key's buffer holds beyond its events.
func (kb *keyBuf) size() int64 { return keyBufOverhead + int64(len(kb.ref.key)) }

type partState struct {
	offsets  []int64 // pending offsets in arrival order
	released map[int64]bool
	next     int64 // one past the highest offset seen
}

// Sequencer is the reorder buffer. Create it with New.
type Sequencer struct {
	cfg   Config
	now   func() time.Time
	keys  map[keyRef]*keyBuf
	parts map[change.Partition]*partState
	due   deadlineHeap
	ready Output // keyless events and conflicts, handed out by the next call
	n     int
	bytes int64 // the sizes of the buffered items
	stats Stats
	// keyEnds are the released deletes of primary-key changes, by key.
	keyEnds map[keyRef]change.Seq
}

// New returns an empty Sequencer; now is its clock (time.Now in production,
// a fake in tests).
func New(cfg Config, now func() time.Time) *Sequencer {
	if now == nil {
		now = time.Now
	}
	if cfg.KeyChangeWait == 0 {
		cfg.KeyChangeWait = max(10*cfg.ReorderWindow, 5*time.Second)
	}
	return &Sequencer{
		cfg:     cfg,
		now:     now,
		keys:    make(map[keyRef]*keyBuf),
		parts:   make(map[change.Partition]*partState),
		keyEnds: make(map[keyRef]change.Seq),
	}
}

func (s *Sequencer) part(p change.Partition) *partState {
	ps := s.parts[p]
	if ps == nil {
		ps = &partState{released: make(map[int64]bool), next: -1}
		s.parts[p] = ps
	}
	return ps
}

func (s *Sequencer) hold(o change.Origin) {
	ps := s.part(o.Partition)
	ps.offsets = append(ps.offsets, o.Offset)
	if o.Offset+1 > ps.next {
		ps.next = o.Offset + 1
	}
}

func (s *Sequencer) release(o change.Origin) {
	ps := s.parts[o.Partition]
	if ps == nil {
		return
	}
	ps.released[o.Offset] = true
	for len(ps.offsets) > 0 && ps.released[ps.offsets[0]] {
		delete(ps.released, ps.offsets[0])
		ps.offsets = ps.offsets[1:]
	}
}

// Skip records a message that needs no apply (a tombstone, a heartbeat), so
// the commit point may pass it.
func (s *Sequencer) Skip(o change.Origin) {
	ps := s.part(o.Partition)
	if o.Offset+1 > ps.next {
		ps.next = o.Offset + 1
	}
}

// Place records that a partition is read from next on (a seek): its
// commit point is at least next even before anything is read there.
func (s *Sequencer) Place(p change.Partition, next int64) {
	ps := s.part(p)
	if next > ps.next {
		ps.next = next
	}
}

// Add buffers an event. Keyless events (truncates) are released by the next
// call to Release.
func (s *Sequencer) Add(ev *change.Event) {
	s.hold(ev.Origin)
	if ev.Key == nil {
		s.ready.Events = append(s.ready.Events, ev)
		return
	}
	ref := keyRef{ev.Table, ev.KeyID()}
	kb := s.keys[ref]
	if kb == nil {
		// The identity is copied: the event's shares its image's memory,
		// which the key's buffer (and keyEnds) may outlive.
		kb = &keyBuf{ref: keyRef{ref.table, strings.Clone(ref.key)}}
		kb.items = kb.first[:0]
		s.keys[kb.ref] = kb
		s.bytes += kb.size()
	}
	tag := seqTag(ev.Seq)
	for _, it := range kb.items {
		if it.seqTag != tag || it.ev.Seq.Compare(ev.Seq) != 0 {
			continue
		}
		if it.ev.Hash() == ev.Hash() {
			s.stats.Duplicates++
			s.release(ev.Origin)
		} else {
			s.stats.Conflicts++
			s.ready.Conflicts = append(s.ready.Conflicts, Conflict{Event: ev, Err: errConflict(it.ev, ev)})
		}
		return
	}
	dl := s.now().Add(s.cfg.ReorderWindow).UnixNano()
	it := item{ev: ev, deadline: dl, size: int64(ev.Size()) + itemOverhead, seqTag: tag}
	s.bytes += it.size
	if ev.OldKey != nil && ev.Op == change.OpCreate {
		it.gate = s.now().Add(s.cfg.KeyChangeWait).UnixNano()
	}
	inFirst := len(kb.items) == 1 && &kb.items[0] == &kb.first[0]
	kb.items = append(kb.items, it)
	if inFirst {
		kb.first[0] = item{} // moved: no event kept alive by the old place
	}
	s.n++
	if len(kb.items) == 1 {
		kb.scheduled = dl
		s.due.push(dueEntry{at: dl, kb: kb})
	}
}

// Len returns the number of buffered events.
func (s *Sequencer) Len() int { return s.n }

// Bytes returns the estimated memory of the buffered events.
func (s *Sequencer) Bytes() int64 { return s.bytes }

func (s *Sequencer) overBudget() bool {
	return s.cfg.MaxBufferedBytes > 0 && s.bytes > s.cfg.MaxBufferedBytes
}

// Full reports whether the buffer holds MaxBufferedEvents or more; the
// caller should pause fetching until it is not.
func (s *Sequencer) Full() bool { return s.cfg.MaxBufferedEvents > 0 && s.n >= s.cfg.MaxBufferedEvents }

// Stats returns the counters.
func (s *Sequencer) Stats() Stats { return s.stats }

// NextDeadline returns when the earliest buffered event becomes due.
func (s *Sequencer) NextDeadline() (time.Time, bool) {
	for s.due.Len() > 0 {
		top := s.due[0]
		if !top.kb.gone && top.kb.scheduled == top.at {
			return time.Unix(0, top.at), true
		}
		s.due.pop()
	}
	return time.Time{}, false
}

// Release hands out every event that is due at the clock's current time,
// together with the earlier buffered events of the same keys; and, while
// the buffer is over MaxBufferedBytes, the keys due soonest.
func (s *Sequencer) Release() Output { return s.releaseDue(nil) }

// ReleaseQuiet is Release, and it hands out every buffered event of the
// tables quiet names as if its window had ended: the caller knows their
// input is quiet (their partitions read to their ends, nothing new for a
// while), so no earlier event of their keys is on its way, and waiting
// out the rest of the window would only delay the history (the end of a
// backlog, a burst followed by silence). Should one come after all, the
// sink repairs it like any late event, exact as the budget's early
// releases are. The create of a primary-key change still waits for its
// old key on the real clock, with its key's later events.
func (s *Sequencer) ReleaseQuiet(quiet func(table string) bool) Output { return s.releaseDue(quiet) }

func (s *Sequencer) releaseDue(quiet func(table string) bool) Output {
	clock := s.now().UnixNano()
	out := s.takeReady()
	// Over budget, a key whose primary-key create still waits for its
	// old key is set aside for the rest of this call: the create's wait
	// is counted on the real clock, never skipped to make room (it would
	// take its placeholders from an old key whose delete is not applied
	// yet), and the other keys make the room.
	var waiting []dueEntry
	var aside map[*keyBuf]bool
	// take releases what is due of e's key: at the clock, or (e early)
	// over budget or with its table quiet; all of it when all is set (a
	// quiet table's key: what rounds of its next deadline would release
	// one after the other). Entries it cannot take yet go back to the
	// heap at the end (waiting).
	take := func(e dueEntry, all bool) {
		kb := e.kb
		if kb.gone || kb.scheduled != e.at {
			return // stale entry
		}
		early := e.at > clock
		budget := early && s.overBudget()
		if early && !budget && (quiet == nil || !quiet(kb.ref.table)) {
			waiting = append(waiting, e) // not due, and its table's input is not quiet
			return
		}
		if aside[kb] {
			waiting = append(waiting, e)
			return
		}
		now := max(clock, e.at) // over budget: as if the clock were at the key's deadline
		if all {
			now = math.MaxInt64
		}
		var upto change.Seq
		for _, it := range kb.items {
			// Every due event counts, not only those before the first
			// that is not: a postponed event (a waiting create, the events
			// after it) can be due after one that came later.
			if it.deadline <= now && (upto == nil || it.ev.Seq.Compare(upto) > 0) {
				upto = it.ev.Seq
			}
		}
		kb.scheduled = 0 // the entry just taken is gone: whatever stays is scheduled anew
		held := s.gated(kb, upto, clock)
		if held != nil && s.releaseOldKey(kb.ref.table, held.it.ev, &out, clock, 0) {
			held = s.gated(kb, upto, clock)
		}
		if held != nil {
			upto = held.before
			s.postpone(kb, held, clock)
			if e.at > clock {
				if aside == nil {
					aside = map[*keyBuf]bool{}
				}
				aside[kb] = true
			}
			if upto == nil {
				s.reschedule(kb.ref, kb)
				return
			}
		}
		s.releaseKey(kb, &out, func(it item) bool {
			take := it.ev.Seq.Compare(upto) <= 0
			if take && early && it.deadline > clock {
				if budget {
					s.stats.ReleasedEarly++
				} else {
					s.stats.ReleasedQuiet++
				}
			}
			return take
		})
	}
	// Due at the clock, or over budget: soonest first.
	for s.due.Len() > 0 && (s.due[0].at <= clock || s.overBudget()) {
		take(s.due.pop(), false)
	}
	if quiet != nil {
		// The keys of quiet tables, soonest first, taken out of the heap
		// in one pass (with the stale entries met): popping every entry
		// to find them cost a heap operation per buffered key and poll
		// while another table's input was busy.
		picked := s.due.extract(func(e dueEntry) bool {
			return e.kb.gone || e.kb.scheduled != e.at || quiet(e.kb.ref.table)
		})
		sort.Slice(picked, func(i, j int) bool { return picked[i].at < picked[j].at })
		for _, e := range picked {
			take(e, true)
		}
	}
	for _, e := range waiting {
		s.due.push(e)
	}
	return out
}

// CommitPoints returns, for every partition seen, the offset below which
// everything has been handed out: the offset to commit.
func (s *Sequencer) CommitPoints() map[change.Partition]int64 {
	out := make(map[change.Partition]int64, len(s.parts))
	for p, ps := range s.parts {
		switch {
		case len(ps.offsets) > 0:
			out[p] = ps.offsets[0]
		case ps.next >= 0:
			out[p] = ps.next
		}
	}
	return out
}

func (s *Sequencer) takeReady() Output {
	out := s.ready
	s.ready = Output{}
	for _, ev := range out.Events {
		s.release(ev.Origin)
	}
	for _, c := range out.Conflicts {
		s.release(c.Event.Origin)
	}
	s.stats.Released += int64(out.Len())
	return out
}

// releaseKey hands out the items of kb selected by take, in sequence order.
func (s *Sequencer) releaseKey(kb *keyBuf, out *Output, take func(item) bool) {
	// Taken events go straight to out.Events, then are sorted there.
	from := len(out.Events)
	kept := kb.items[:0]
	for _, it := range kb.items {
		if take(it) {
			out.Events = append(out.Events, it.ev)
			s.bytes -= it.size
		} else {
			kept = append(kept, it)
		}
	}
	clear(kb.items[len(kept):]) // no event kept alive past the end
	kb.items = kept
	taken := out.Events[from:]
	if len(taken) > 1 {
		slices.SortStableFunc(taken, func(a, b *change.Event) int { return a.Seq.Compare(b.Seq) })
	}
	for _, ev := range taken {
		s.release(ev.Origin)
		s.noteKeyChange(kb.ref, ev)
	}
	s.n -= len(taken)
	s.stats.Released += int64(len(taken))
	s.reschedule(kb.ref, kb)
}

func (s *Sequencer) reschedule(ref keyRef, kb *keyBuf) {
	if len(kb.items) == 0 {
		if !kb.gone {
			delete(s.keys, ref)
			s.bytes -= kb.size()
		}
		kb.scheduled, kb.gone = 0, true
		return
	}
	first := kb.items[0].deadline
	for _, it := range kb.items[1:] {
		first = min(first, it.deadline) // a waiting create's deadline moves
	}
	if kb.scheduled != first {
		kb.scheduled = first
		s.due.push(dueEntry{at: first, kb: kb})
	}
}

func (s *Sequencer) sortedKeys() []*keyBuf {
	kbs := make([]*keyBuf, 0, len(s.keys))
	for _, kb := range s.keys {
		kbs = append(kbs, kb)
	}
	opens := make(map[*keyBuf]bool)
	for _, kb := range kbs {
		if kb.opensKey() {
			opens[kb] = true
		}
	}
	sort.Slice(kbs, func(i, j int) bool {
		if opens[kbs[i]] != opens[kbs[j]] {
			return opens[kbs[j]]
		}
		if kbs[i].ref.table != kbs[j].ref.table {
			return kbs[i].ref.table < kbs[j].ref.table
		}
		return kbs[i].ref.key < kbs[j].ref.key
	})
	return kbs
}

type dueEntry struct {
	at int64
	kb *keyBuf
}

// deadlineHeap orders keys by when their first buffered event is due: a
// binary min-heap on at, typed (container/heap would box every entry).
type deadlineHeap []dueEntry

func (h deadlineHeap) Len() int { return len(h) }

func (h *deadlineHeap) push(e dueEntry) {
	*h = append(*h, e)
	q := *h
	for i := len(q) - 1; i > 0; {
		parent := (i - 1) / 2
		if q[parent].at <= q[i].at {
			break
		}
		q[parent], q[i] = q[i], q[parent]
		i = parent
	}
}

func (h *deadlineHeap) pop() dueEntry {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q[n] = dueEntry{} // no pointer kept past the end
	q = q[:n]
	q.down(0)
	*h = q
	return top
}

// down moves the entry at i down to its place.
func (h deadlineHeap) down(i int) {
	for n := len(h); ; {
		small, l, r := i, 2*i+1, 2*i+2
		if l < n && h[l].at < h[small].at {
			small = l
		}
		if r < n && h[r].at < h[small].at {
			small = r
		}
		if small == i {
			return
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
}

// extract removes the entries pick chooses and returns them, in no
// order; the rest is a heap again. One pass, and a linear rebuild.
func (h *deadlineHeap) extract(pick func(dueEntry) bool) []dueEntry {
	q := *h
	var out []dueEntry
	kept := q[:0]
	for _, e := range q {
		if pick(e) {
			out = append(out, e)
		} else {
			kept = append(kept, e)
		}
	}
	clear(q[len(kept):]) // no pointer kept past the end
	for i := len(kept)/2 - 1; i >= 0; i-- {
		kept.down(i)
	}
	*h = kept
	return out
}

func errConflict(first, second *change.Event) error {
	return fmt.Errorf("conflict: key %v sequence %s already has an event with other content (first at %s@%d, this at %s@%d)",
		second.Key, second.Seq, first.Origin.Partition, first.Origin.Offset, second.Origin.Partition, second.Origin.Offset)
}
