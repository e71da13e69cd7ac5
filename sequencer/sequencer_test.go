package sequencer

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/scd2sink/scd2sink/internal/change"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

var p0 = change.Partition{Topic: "t", Partition: 0}
var p1 = change.Partition{Topic: "t", Partition: 1}

func ev(p change.Partition, off int64, key string, seq int64, val string) *change.Event {
	return &change.Event{
		Table:  "tbl",
		Key:    []any{key},
		Seq:    change.MustSeq(seq),
		Op:     change.OpUpdate,
		After:  map[string]any{"k": key, "v": val},
		Origin: change.Origin{Partition: p, Offset: off},
	}
}

func seqs(evs []*change.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Key[0].(string)+e.Seq.String())
	}
	return out
}

func newSeq(t *testing.T, window time.Duration, max int) (*Sequencer, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	return New(Config{ReorderWindow: window, MaxBufferedEvents: max}, clk.now), clk
}

func TestReleaseOrder(t *testing.T) {
	tests := []struct {
		name    string
		adds    []*change.Event
		advance time.Duration
		want    []string
	}{
		{"nothing before the window", []*change.Event{ev(p0, 0, "a", 2, "x")}, time.Second, nil},
		{"sorted after the window", []*change.Event{ev(p0, 0, "a", 3, "x"), ev(p0, 1, "a", 1, "y"), ev(p0, 2, "a", 2, "z")}, 2 * time.Second, []string{"a[1]", "a[2]", "a[3]"}},
		{"keys independent", []*change.Event{ev(p0, 0, "b", 5, "x"), ev(p0, 1, "a", 1, "y")}, 2 * time.Second, []string{"b[5]", "a[1]"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, clk := newSeq(t, 2*time.Second, 0)
			for _, e := range tc.adds {
				s.Add(e)
			}
			clk.advance(tc.advance)
			got := seqs(s.Release().Events)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("released %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDueEventTakesEarlierOnesOfItsKey(t *testing.T) {
	s, clk := newSeq(t, 2*time.Second, 0)
	s.Add(ev(p0, 0, "a", 5, "x"))
	clk.advance(time.Second)
	s.Add(ev(p0, 1, "a", 3, "y")) // earlier sequence, not yet due
	s.Add(ev(p0, 2, "a", 7, "z")) // later sequence, not yet due
	clk.advance(time.Second)
	if got := seqs(s.Release().Events); !slices.Equal(got, []string{"a[3]", "a[5]"}) {
		t.Fatalf("released %v", got)
	}
	if got := s.CommitPoints()[p0]; got != 2 {
		t.Fatalf("commit point %d, want 2 (offset 2 still buffered)", got)
	}
	clk.advance(time.Second)
	if got := seqs(s.Release().Events); !slices.Equal(got, []string{"a[7]"}) {
		t.Fatalf("released %v", got)
	}
	if got := s.CommitPoints()[p0]; got != 3 {
		t.Fatalf("commit point %d, want 3", got)
	}
}

func TestDuplicatesAndConflicts(t *testing.T) {
	s, clk := newSeq(t, time.Second, 0)
	s.Add(ev(p0, 0, "a", 1, "x"))
	s.Add(ev(p0, 1, "a", 1, "x")) // exact duplicate
	s.Add(ev(p0, 2, "a", 1, "other"))
	if s.Len() != 1 {
		t.Fatalf("buffered %d, want 1", s.Len())
	}
	out := s.Release()
	if len(out.Events) != 0 || len(out.Conflicts) != 1 || out.Conflicts[0].Event.Origin.Offset != 2 {
		t.Fatalf("first release: %+v", out)
	}
	if got := s.CommitPoints()[p0]; got != 0 {
		t.Fatalf("commit point %d, want 0", got)
	}
	clk.advance(time.Second)
	out = s.Release()
	if len(out.Events) != 1 || out.Events[0].Origin.Offset != 0 {
		t.Fatalf("second release: %+v", out)
	}
	if got := s.CommitPoints()[p0]; got != 3 {
		t.Fatalf("commit point %d, want 3", got)
	}
	if st := s.Stats(); st.Duplicates != 1 || st.Conflicts != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSkipAndBackPressure(t *testing.T) {
	s, _ := newSeq(t, time.Second, 2)
	s.Skip(change.Origin{Partition: p1, Offset: 41})
	if got := s.CommitPoints()[p1]; got != 42 {
		t.Fatalf("commit point after skip %d, want 42", got)
	}
	s.Add(ev(p0, 0, "a", 1, "x"))
	if s.Full() {
		t.Fatal("full with 1 of 2")
	}
	s.Add(ev(p0, 1, "b", 1, "x"))
	if !s.Full() {
		t.Fatal("not full with 2 of 2")
	}
	if got := len(s.Flush().Events); got != 2 || s.Full() || s.Len() != 0 {
		t.Fatalf("flush released %d, len %d", got, s.Len())
	}
}

func TestRevokeAndLoss(t *testing.T) {
	s, _ := newSeq(t, time.Hour, 0)
	s.Add(ev(p0, 0, "a", 1, "x"))
	s.Add(ev(p1, 0, "b", 1, "x"))
	s.Add(ev(p1, 1, "c", 1, "x"))
	out := s.FlushPartitions([]change.Partition{p1})
	if got := seqs(out.Events); !slices.Equal(got, []string{"b[1]", "c[1]"}) {
		t.Fatalf("flushed %v", got)
	}
	if cp := s.CommitPoints(); cp[p1] != 2 || cp[p0] != 0 {
		t.Fatalf("commit points %v", cp)
	}
	s.DropPartitions([]change.Partition{p0})
	if s.Len() != 0 {
		t.Fatalf("len %d after drop", s.Len())
	}
	if _, ok := s.CommitPoints()[p0]; ok {
		t.Fatal("dropped partition still has a commit point")
	}
	if _, ok := s.NextDeadline(); ok {
		t.Fatal("deadline left after drop")
	}
}

// TestRandomised checks, over random arrivals and release times, that every
// event comes out exactly once, a key's events come out in sequence order
// within each release, and the commit point never passes a buffered event.
func TestRandomised(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		s, clk := newSeq(t, time.Duration(1+rng.IntN(5))*time.Second, 0)
		held := map[int64]bool{}
		out := map[int64]int{}
		var off int64
		check := func(o Output) {
			last := map[string]change.Seq{}
			for _, e := range o.Events {
				out[e.Origin.Offset]++
				delete(held, e.Origin.Offset)
				k := e.KeyID()
				if prev, ok := last[k]; ok && prev.Compare(e.Seq) >= 0 {
					t.Fatalf("seed %d: key %v out of order in one release", seed, e.Key)
				}
				last[k] = e.Seq
			}
			cp := s.CommitPoints()[p0]
			for o := range held {
				if o < cp {
					t.Fatalf("seed %d: commit point %d passes buffered offset %d", seed, cp, o)
				}
			}
		}
		for i := 0; i < 300; i++ {
			key := string(rune('a' + rng.IntN(8)))
			s.Add(ev(p0, off, key, int64(rng.IntN(1000000)), key+string(rune(off))))
			held[off] = true
			off++
			clk.advance(time.Duration(rng.IntN(800)) * time.Millisecond)
			if rng.IntN(3) == 0 {
				check(s.Release())
			}
		}
		check(s.Flush())
		dups := s.Stats().Duplicates + s.Stats().Conflicts
		if int64(len(out))+dups != off {
			t.Fatalf("seed %d: %d events out + %d dropped, want %d", seed, len(out), dups, off)
		}
		if cp := s.CommitPoints()[p0]; cp != off {
			t.Fatalf("seed %d: final commit point %d, want %d", seed, cp, off)
		}
	}
}

// TestKeyIdentityCopied: a key's buffer keeps its own copy of the key's
// identity, not the event's, which shares the event's image memory
// (debezium's decoder builds it there) and would keep it alive as long as
// the key has events buffered.
func TestKeyIdentityCopied(t *testing.T) {
	s, _ := newSeq(t, time.Second, 100)
	e := ev(p0, 1, "k", 1, "a")
	buf := []byte(change.KeyID(e.Key))
	e.SetKeyID(unsafe.String(&buf[0], len(buf)))
	s.Add(e)
	for ref := range s.keys {
		if unsafe.StringData(ref.key) == &buf[0] || unsafe.StringData(s.keys[ref].ref.key) == &buf[0] {
			t.Fatal("the key's buffer keeps the event's identity bytes")
		}
	}
}
