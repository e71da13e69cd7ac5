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
		clk.advance(window)
		if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"old[120]"}) {
			t.Fatalf("first release %v, want the delete alone", seqs(out.Events))
		}
		clk.advance(gateStep)
		if out := s.Release(); !slices.Equal(seqs(out.Events), []string{"new[121]", "new[130]"}) {
			t.Fatalf("second release %v, want the new key's events", seqs(out.Events))
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
	t.Run("flush does not wait", func(t *testing.T) {
		s, _ := newSeq(t, window, 0)
		s.Add(create())
		if out := s.Flush(); len(out.Events) != 1 {
			t.Fatalf("flush released %v", seqs(out.Events))
		}
	})
}
