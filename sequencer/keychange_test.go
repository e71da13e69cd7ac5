package sequencer

import (
	"slices"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// The create of a primary-key change waits for its old key's delete (which
// may come through another partition, later) to be released first; it
// waits at most KeyChangeWait; the new key's later events wait with it.
func TestKeyChangeWaitsForTheOldKey(t *testing.T) {
	window := 100 * time.Millisecond
	create := func() *change.Event {
		c := ev(p1, 0, "new", 121, "moved")
		c.Op, c.OldKey = change.OpCreate, []any{"old"}
		return c
	}
	del := func() *change.Event {
		d := ev(p0, 0, "old", 120, "")
		d.Op, d.After, d.KeyChanged = change.OpDelete, nil, true
		return d
	}
	t.Run("the delete comes later: the create waits for it", func(t *testing.T) {
		s, clk := newSeq(t, window, 0)
		s.Add(create())
		s.Add(ev(p1, 1, "new", 130, "after"))
		clk.advance(3 * window)
		if out := s.Release(); len(out.Events) != 0 {
			t.Fatalf("released %v before the old key's delete", seqs(out.Events))
		}
		if cp := s.CommitPoints()[p1]; cp != 0 {
			t.Fatalf("commit point %d passed the waiting create", cp)
		}
		s.Add(del())
		clk.advance(gateStep)
		if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"old[120]", "new[121]", "new[130]"}) {
			t.Fatalf("release %v, want the delete and then the new key's events at the next look", seqs(out.Events))
		}
		if len(s.keyEnds) != 0 {
			t.Errorf("the delete is still remembered: %v", s.keyEnds)
		}
	})
	t.Run("the delete never comes: the wait runs out", func(t *testing.T) {
		s, clk := newSeq(t, window, 0)
		s.Add(create())
		for waited := gateStep; waited < s.cfg.KeyChangeWait; waited += gateStep {
			clk.advance(gateStep)
			if out := s.Release(); len(out.Events) != 0 {
				t.Fatalf("released after %v, before KeyChangeWait %v", waited, s.cfg.KeyChangeWait)
			}
		}
		clk.advance(gateStep)
		if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"new[121]"}) {
			t.Fatalf("after the wait: %v", seqs(out.Events))
		}
	})
	t.Run("over the byte budget the create still waits, and the rest makes room", func(t *testing.T) {
		s, clk := newSeq(t, window, 0)
		s.cfg.MaxBufferedBytes = 1 // every call is over budget
		s.Add(create())
		s.Add(ev(p1, 1, "new", 130, "after"))
		s.Add(ev(p1, 2, "other", 5, "x"))
		clk.advance(time.Millisecond) // inside every window
		if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"other[5]"}) {
			t.Fatalf("released %v, want only the other key's event: the create waits for its old key's delete", seqs(out.Events))
		}
		for waited := gateStep; waited < s.cfg.KeyChangeWait-time.Millisecond; waited += gateStep {
			clk.advance(gateStep)
			if out := s.Release(); len(out.Events) != 0 {
				t.Fatalf("released %v after %v, before KeyChangeWait %v", seqs(out.Events), waited, s.cfg.KeyChangeWait)
			}
		}
		s.Add(del())
		if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"old[120]", "new[121]", "new[130]"}) {
			t.Fatalf("release %v, want the delete and then the new key's events", seqs(out.Events))
		}
		if s.Bytes() != 0 || s.Len() != 0 {
			t.Fatalf("%d bytes, %d events left", s.Bytes(), s.Len())
		}
	})
	// With a window shorter than gateStep, a postponed event can be due
	// after one that came later: every due event counts, not only those
	// before the first that is not, or the key is left with none due and
	// no deadline to wake it.
	t.Run("a short window: events postponed behind later ones are not stranded", func(t *testing.T) {
		s, clk := newSeq(t, 10*time.Millisecond, 0)
		mk := func(key string, seq int64, op change.Op, oldKey string, keyChanged bool) *change.Event {
			e := ev(p0, int64(s.Len()), key, seq, key)
			e.Op, e.KeyChanged = op, keyChanged
			if oldKey != "" {
				e.OldKey = []any{oldKey}
			}
			if op == change.OpDelete {
				e.After = nil
			}
			return e
		}
		s.Add(mk("new", 121, change.OpCreate, "o", false)) // waits for o's delete
		clk.advance(time.Millisecond)
		s.Add(mk("new", 125, change.OpDelete, "", true)) // new becomes z
		clk.advance(time.Millisecond)
		s.Add(mk("new", 150, change.OpUpdate, "", false))
		clk.advance(8 * time.Millisecond)
		if out := s.Release(); len(out.Events) != 0 {
			t.Fatalf("released %v while the create waits", seqs(out.Events))
		}
		clk.advance(10 * time.Millisecond)
		s.Add(mk("new", 160, change.OpUpdate, "", false))
		s.Add(mk("z", 125, change.OpCreate, "new", false))
		clk.advance(time.Millisecond)
		s.Add(mk("o", 120, change.OpDelete, "", true))
		clk.advance(9 * time.Millisecond)
		out := s.Release()
		clk.advance(100 * time.Millisecond)
		out.Events = append(out.Events, s.Release().Events...)
		got := seqs(out.Events)
		for _, want := range []string{"o[120]", "new[121]", "new[125]", "z[125]", "new[150]", "new[160]"} {
			if !slices.Contains(got, want) {
				t.Fatalf("released %v, missing %s: stranded in the buffer", got, want)
			}
		}
		if s.Len() != 0 || s.Bytes() != 0 {
			t.Fatalf("%d events, %d bytes left", s.Len(), s.Bytes())
		}
	})
	t.Run("the delete came first: no wait", func(t *testing.T) {
		s, clk := newSeq(t, window, 0)
		s.Add(del())
		clk.advance(window)
		s.Release()
		s.Add(create())
		clk.advance(window)
		if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"new[121]"}) {
			t.Fatalf("got %v", seqs(out.Events))
		}
	})
	// A revoke (FlushPartitions) or a drain (Flush) hands out what is
	// held, but not a create whose old key's delete has not been seen: it
	// would take NULL for its placeholders. It stays behind the commit
	// point for the partition's next reader; the key's events before it go.
	t.Run("a revoke leaves a waiting create to the next owner", func(t *testing.T) {
		s, _ := newSeq(t, window, 0)
		s.Add(ev(p1, 0, "new", 100, "before"))
		c := create()
		c.Origin.Offset = 1
		s.Add(c)
		s.Add(ev(p1, 2, "new", 130, "after"))
		s.Add(ev(p1, 3, "other", 140, "x"))
		out := s.FlushPartitions([]change.Partition{p1})
		if got := seqs(out.Events); !slices.Equal(got, []string{"other[140]", "new[100]"}) {
			t.Fatalf("revoke released %v, want the other key and the new key's event before the create", got)
		}
		if cp := s.CommitPoints()[p1]; cp != 1 {
			t.Fatalf("commit point %d, want 1 (the waiting create)", cp)
		}
		s.DropPartitions([]change.Partition{p1})
		if s.Len() != 0 {
			t.Fatalf("%d events left after the drop", s.Len())
		}
	})
	t.Run("a drain leaves a waiting create to the next start", func(t *testing.T) {
		s, _ := newSeq(t, window, 0)
		s.Add(create())
		if out := s.Flush(); len(out.Events) != 0 {
			t.Fatalf("flush released %v", seqs(out.Events))
		}
		if cp := s.CommitPoints()[p1]; cp != 0 {
			t.Fatalf("commit point %d passed the waiting create", cp)
		}
	})
	t.Run("a revoke takes the old key's delete along when it is buffered", func(t *testing.T) {
		s, _ := newSeq(t, window, 0)
		s.Add(ev(p0, 5, "old", 110, "was"))
		s.Add(del())
		s.Add(create())
		out := s.FlushPartitions([]change.Partition{p1})
		if got := seqs(out.Events); !slices.Equal(got, []string{"old[110]", "old[120]", "new[121]"}) {
			t.Fatalf("revoke released %v, want the old key up to its delete, then the create", got)
		}
		if cp := s.CommitPoints()[p0]; cp != 6 {
			t.Fatalf("the kept partition's commit point %d, want 6", cp)
		}
	})
	t.Run("once the wait ran out a flush releases the create", func(t *testing.T) {
		s, clk := newSeq(t, window, 0)
		s.Add(create())
		clk.advance(s.cfg.KeyChangeWait)
		if out := s.Flush(); len(out.Events) != 1 {
			t.Fatalf("flush released %v", seqs(out.Events))
		}
	})
}

// Debezium writes a primary-key change's delete and create with the same
// sequence (one WAL record): the delete counts as before the create, and
// the create waits no longer than any other event (DESIGN.md section 5).
func TestKeyChangeAtEqualSequences(t *testing.T) {
	window := 100 * time.Millisecond
	pair := func(delPart, createPart change.Partition) (*change.Event, *change.Event) {
		d := ev(delPart, 10, "old", 120, "")
		d.Op, d.After, d.KeyChanged = change.OpDelete, nil, true
		c := ev(createPart, 12, "new", 120, "moved")
		c.Op, c.OldKey = change.OpCreate, []any{"old"}
		return d, c
	}
	for _, parts := range []struct {
		name   string
		del    change.Partition
		create change.Partition
	}{{"one partition", p0, p0}, {"two partitions", p0, p1}} {
		t.Run(parts.name+": both buffered, released together, delete first", func(t *testing.T) {
			s, clk := newSeq(t, window, 0)
			d, c := pair(parts.del, parts.create)
			s.Add(ev(parts.del, 9, "old", 110, "before"))
			s.Add(c) // the create arrives first: its window ends first
			clk.advance(window / 2)
			s.Add(d)
			clk.advance(window / 2)
			out := s.Release()
			if want := []string{"old[110]", "old[120]", "new[120]"}; !slices.Equal(seqs(out.Events), want) {
				t.Fatalf("released %v at the create's deadline, want %v", seqs(out.Events), want)
			}
			if s.Len() != 0 {
				t.Errorf("%d events still buffered", s.Len())
			}
			for p, cp := range s.CommitPoints() {
				if cp != 13 && cp != 11 {
					t.Errorf("commit point of %v is %d: held", p, cp)
				}
			}
		})
		t.Run(parts.name+": the delete released before, the create goes at its deadline", func(t *testing.T) {
			s, clk := newSeq(t, window, 0)
			d, c := pair(parts.del, parts.create)
			s.Add(d)
			clk.advance(window)
			if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"old[120]"}) {
				t.Fatalf("first release %v", seqs(out.Events))
			}
			s.Add(c)
			clk.advance(window)
			if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"new[120]"}) {
				t.Fatalf("the create waited: %v", seqs(out.Events))
			}
		})
		t.Run(parts.name+": the delete arrives after the create's deadline, both go at once", func(t *testing.T) {
			s, clk := newSeq(t, window, 0)
			d, c := pair(parts.del, parts.create)
			s.Add(c)
			clk.advance(2 * window)
			if out := s.Release(); len(out.Events) != 0 {
				t.Fatalf("released %v before the old key's delete", seqs(out.Events))
			}
			s.Add(d)
			clk.advance(gateStep)
			if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"old[120]", "new[120]"}) {
				t.Fatalf("released %v one look after the delete arrived", seqs(out.Events))
			}
		})
	}
	t.Run("a later delete of the old key is not released early", func(t *testing.T) {
		s, clk := newSeq(t, window, 0)
		d, c := pair(p0, p1)
		later := ev(p0, 20, "old", 200, "")
		later.Op, later.After, later.KeyChanged = change.OpDelete, nil, true
		s.Add(c)
		clk.advance(window / 2)
		s.Add(later)
		s.Add(d)
		clk.advance(window / 2)
		if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"old[120]", "new[120]"}) {
			t.Fatalf("released %v", seqs(out.Events))
		}
		if s.Len() != 1 {
			t.Fatalf("old[200] should still wait; buffered %d", s.Len())
		}
	})
	t.Run("flush puts the old key first", func(t *testing.T) {
		s, _ := newSeq(t, window, 0)
		d, c := pair(p1, p0)
		d.Key, d.Table, c.Table = []any{"zzz"}, "tbl", "tbl"
		c.OldKey = []any{"zzz"}
		c.Key = []any{"aaa"}
		s.Add(c)
		s.Add(d)
		if out := s.Flush(); !slices.Equal(seqs(out.Events), []string{"zzz[120]", "aaa[120]"}) {
			t.Fatalf("flush order %v", seqs(out.Events))
		}
	})
}

// A chain of primary-key changes, A→B then B→C, with A's delete late in
// another partition: C's create must not release B's create (gated on
// A's delete) ahead of it; once A's delete comes, the chain is released
// in order at once.
func TestKeyChangeChain(t *testing.T) {
	window := 100 * time.Millisecond
	s, clk := newSeq(t, window, 0)
	createB := ev(p1, 0, "B", 121, "moved")
	createB.Op, createB.OldKey = change.OpCreate, []any{"A"}
	delB := ev(p1, 1, "B", 131, "")
	delB.Op, delB.After, delB.KeyChanged = change.OpDelete, nil, true
	createC := ev(p1, 2, "C", 131, "moved again")
	createC.Op, createC.OldKey = change.OpCreate, []any{"B"}
	for _, e := range []*change.Event{createB, delB, createC} {
		s.Add(e)
	}
	clk.advance(3 * window)
	if out := s.Release(); len(out.Events) != 0 {
		t.Fatalf("released %v before A's delete", seqs(out.Events))
	}
	delA := ev(p0, 0, "A", 120, "")
	delA.Op, delA.After, delA.KeyChanged = change.OpDelete, nil, true
	s.Add(delA)
	clk.advance(gateStep)
	if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"A[120]", "B[121]", "B[131]", "C[131]"}) {
		t.Fatalf("release %v, want the chain in order", seqs(out.Events))
	}
}
