package sequencer

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// TestReleaseQuiet: a quiet input releases every buffered key of the
// tables it names at once, in sequence order per key, before the window
// ends, and moves the commit points past them (nothing of a table it does
// not name); the create of a primary-key change whose old key's delete
// has not come still waits for it, with its key's later events.
func TestReleaseQuiet(t *testing.T) {
	s, clk := newSeq(t, 2*time.Second, 0)
	s.Add(ev(p0, 0, "a", 5, "x"))
	s.Add(ev(p0, 1, "b", 2, "y"))
	clk.advance(time.Second)
	s.Add(ev(p0, 2, "a", 3, "z")) // earlier sequence, arrived later
	create := ev(p1, 0, "new", 121, "moved")
	create.Op, create.OldKey = change.OpCreate, []any{"old"}
	s.Add(create)
	s.Add(ev(p1, 1, "new", 130, "after"))
	clk.advance(100 * time.Millisecond)
	if out := s.Release(); out.Len() != 0 {
		t.Fatalf("released %v before the window", seqs(out.Events))
	}
	if out := s.ReleaseQuiet(func(table string) bool { return table != "tbl" }); out.Len() != 0 {
		t.Fatalf("released %v of a table whose input is not quiet", seqs(out.Events))
	}
	all := func(string) bool { return true }
	out := s.ReleaseQuiet(all)
	if got := seqs(out.Events); !slices.Equal(got, []string{"a[3]", "a[5]", "b[2]"}) && !slices.Equal(got, []string{"b[2]", "a[3]", "a[5]"}) {
		t.Fatalf("quiet release %v, want a[3] a[5] and b[2], not the waiting create", got)
	}
	if got := s.Stats().ReleasedQuiet; got != 3 {
		t.Errorf("ReleasedQuiet %d, want 3", got)
	}
	if got := s.Stats().ReleasedEarly; got != 0 {
		t.Errorf("ReleasedEarly %d, want 0 (that counts the byte budget's)", got)
	}
	if cp := s.CommitPoints(); cp[p0] != 3 || cp[p1] != 0 {
		t.Errorf("commit points %v, want p0 at 3 and p1 at 0 (the create waits)", cp)
	}
	if s.Len() != 2 {
		t.Fatalf("%d events buffered, want the create and its key's later event", s.Len())
	}
	del := ev(p0, 3, "old", 120, "")
	del.Op, del.After, del.KeyChanged = change.OpDelete, nil, true
	s.Add(del)
	clk.advance(gateStep)
	if got := seqs(s.ReleaseQuiet(all).Events); !slices.Equal(got, []string{"old[120]", "new[121]", "new[130]"}) {
		t.Fatalf("after the old key's delete, quiet release %v", got)
	}
	if s.Len() != 0 {
		t.Fatalf("%d events still buffered", s.Len())
	}
}

// TestReleaseQuietWithBudgetAndWaitingCreates: many creates of primary-key
// changes past their window and still waiting for their old keys, quiet
// and over the byte budget at once: every other key is released, counted
// as the budget's early releases while over it, the creates stay, and
// repeated quiet releases leave the deadline heap as it was.
func TestReleaseQuietWithBudgetAndWaitingCreates(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := New(Config{ReorderWindow: time.Second, MaxBufferedBytes: 2000}, clk.now)
	for i := range 50 {
		c := ev(p1, int64(i), fmt.Sprintf("new%d", i), int64(1000+i), "moved")
		c.Op, c.OldKey = change.OpCreate, []any{fmt.Sprintf("old%d", i)}
		s.Add(c)
	}
	clk.advance(2 * time.Second) // past their windows: they wait for their old keys only
	for i := range 20 {
		s.Add(ev(p0, int64(i), fmt.Sprintf("k%d", i), int64(i+1), "x"))
	}
	all := func(string) bool { return true }
	out := s.ReleaseQuiet(all)
	if len(out.Events) != 20 {
		t.Fatalf("released %d events, want the 20 that wait for nothing", len(out.Events))
	}
	st := s.Stats()
	if st.ReleasedEarly+st.ReleasedQuiet != 20 || st.ReleasedEarly == 0 {
		t.Errorf("early %d, quiet %d: want 20 in all, some of them the budget's", st.ReleasedEarly, st.ReleasedQuiet)
	}
	heap := s.due.Len()
	for range 5 {
		if out := s.ReleaseQuiet(all); out.Len() != 0 {
			t.Fatalf("released %v while the creates wait", seqs(out.Events))
		}
	}
	if s.due.Len() > heap {
		t.Errorf("the deadline heap grew from %d to %d entries", heap, s.due.Len())
	}
	if s.Len() != 50 {
		t.Errorf("%d events buffered, want the 50 creates", s.Len())
	}
}

// TestReleaseQuietOneTableOfTwo: with one table's input quiet and
// another's busy, a quiet release takes every buffered event of the
// quiet table's keys, however many deadlines they span, and nothing of
// the busy one's, whose events are then released at their deadlines; the
// deadline heap stays a heap and holds no more entries than keys.
func TestReleaseQuietOneTableOfTwo(t *testing.T) {
	s, clk := newSeq(t, 2*time.Second, 0)
	q := change.Partition{Topic: "q", Partition: 0}
	off := map[change.Partition]int64{}
	add := func(p change.Partition, table, key string, seq int64) {
		e := ev(p, off[p], key, seq, "v")
		e.Table = table
		off[p]++
		s.Add(e)
	}
	for round := range 5 { // five deadlines per key, 100 ms apart
		for k := range 40 {
			add(q, "quiet", fmt.Sprintf("q%d", k), int64(10*round+1))
			add(p0, "busy", fmt.Sprintf("b%d", k), int64(10*round+1))
		}
		clk.advance(100 * time.Millisecond)
	}
	isQuiet := func(table string) bool { return table == "quiet" }
	for range 3 { // later polls find nothing more of it
		out := s.ReleaseQuiet(isQuiet)
		for _, e := range out.Events {
			if e.Table != "quiet" {
				t.Fatalf("released %s of the busy table", e.Key)
			}
		}
		if s.Len() != 200 {
			t.Fatalf("%d events buffered, want the busy table's 200", s.Len())
		}
	}
	if got := s.Stats().ReleasedQuiet; got != 200 {
		t.Fatalf("ReleasedQuiet %d, want 200", got)
	}
	for i := range s.due {
		if l := 2*i + 1; l < len(s.due) && s.due[l].at < s.due[i].at {
			t.Fatalf("heap order broken at %d", i)
		}
		if r := 2*i + 2; r < len(s.due) && s.due[r].at < s.due[i].at {
			t.Fatalf("heap order broken at %d", i)
		}
	}
	if s.due.Len() > 40 {
		t.Errorf("%d heap entries for 40 buffered keys", s.due.Len())
	}
	released := 0
	for range 30 { // the busy table's at their deadlines, 100 ms at a time
		clk.advance(100 * time.Millisecond)
		out := s.ReleaseQuiet(isQuiet)
		released += len(out.Events)
	}
	if released != 200 || s.Len() != 0 {
		t.Fatalf("released %d of the busy table's 200 at their deadlines, %d left", released, s.Len())
	}
}
