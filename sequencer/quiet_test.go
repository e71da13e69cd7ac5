package sequencer

import (
	"slices"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// TestReleaseQuiet: a quiet input releases every buffered key at once, in
// sequence order per key, before the window ends, and moves the commit
// points past them; the create of a primary-key change whose old key's
// delete has not come still waits for it, with its key's later events.
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
	out := s.ReleaseQuiet()
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
	if got := seqs(s.ReleaseQuiet().Events); !slices.Equal(got, []string{"old[120]", "new[121]", "new[130]"}) {
		t.Fatalf("after the old key's delete, quiet release %v", got)
	}
	if s.Len() != 0 {
		t.Fatalf("%d events still buffered", s.Len())
	}
}
