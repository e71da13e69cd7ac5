package sequencer

import (
	"slices"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// rawEv is an event as the Kafka decoder builds it: a raw row image of
// about size bytes.
func rawEv(off int64, key string, seq int64, size int) *change.Event {
	e := ev(p0, off, key, seq, "")
	e.After, e.AfterJSON = nil, make([]byte, size)
	return e
}

func TestByteBudget(t *testing.T) {
	probe := rawEv(0, "x", 1, 1000)
	probe.KeyID() // as Add computes it
	// What one event of its own key costs the budget: its size, its item
	// and its key's buffer.
	one := int64(probe.Size()) + itemOverhead + (&keyBuf{ref: keyRef{key: probe.KeyID()}}).size()
	tests := []struct {
		name      string
		budget    int64
		adds      []*change.Event
		gaps      []time.Duration // clock advance before each add
		wantFirst []string        // released at once, with the clock inside every window
		wantEarly int64
	}{
		{"under budget: nothing before the window", 3 * one,
			[]*change.Event{rawEv(0, "a", 1, 1000), rawEv(1, "b", 1, 1000), rawEv(2, "c", 1, 1000)},
			[]time.Duration{0, time.Millisecond, time.Millisecond}, nil, 0},
		{"over budget: the keys due soonest, until under it", 2 * one,
			[]*change.Event{rawEv(0, "a", 1, 1000), rawEv(1, "b", 1, 1000), rawEv(2, "c", 1, 1000), rawEv(3, "d", 1, 1000)},
			[]time.Duration{0, time.Millisecond, time.Millisecond, time.Millisecond}, []string{"a[1]", "b[1]"}, 2},
		{"a key's later arrivals wait for their own deadline", 2 * one,
			[]*change.Event{rawEv(0, "a", 1, 1000), rawEv(1, "b", 1, 1000), rawEv(2, "a", 2, 1000)},
			[]time.Duration{0, time.Millisecond, time.Millisecond}, []string{"a[1]"}, 1},
		{"a key's earlier sequences go with it", 2 * one,
			[]*change.Event{rawEv(0, "a", 2, 1000), rawEv(1, "b", 1, 1000), rawEv(2, "a", 1, 1000)},
			[]time.Duration{0, time.Millisecond, time.Millisecond}, []string{"a[1]", "a[2]"}, 2},
		{"sorted within a key released early", one,
			[]*change.Event{rawEv(0, "a", 2, 1000), rawEv(1, "a", 1, 1000), rawEv(2, "b", 1, 1000)},
			[]time.Duration{0, 0, time.Millisecond}, []string{"a[1]", "a[2]"}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			s := New(Config{ReorderWindow: time.Second, MaxBufferedBytes: tc.budget}, clk.now)
			for i, e := range tc.adds {
				clk.advance(tc.gaps[i])
				s.Add(e)
			}
			out := s.Release()
			if got := seqs(out.Events); !slices.Equal(got, tc.wantFirst) {
				t.Fatalf("released %v, want %v", got, tc.wantFirst)
			}
			if s.Bytes() > tc.budget {
				t.Fatalf("%d bytes buffered after Release, budget %d", s.Bytes(), tc.budget)
			}
			if got := s.Stats().ReleasedEarly; got != tc.wantEarly {
				t.Fatalf("ReleasedEarly %d, want %d", got, tc.wantEarly)
			}
			// The rest comes out at its deadline, and the books balance.
			clk.advance(2 * time.Second)
			rest := s.Release()
			if n := len(out.Events) + len(rest.Events); n != len(tc.adds) {
				t.Fatalf("%d events released in all, want %d", n, len(tc.adds))
			}
			if s.Bytes() != 0 || s.Len() != 0 {
				t.Fatalf("%d bytes, %d events left", s.Bytes(), s.Len())
			}
			if cp := s.CommitPoints()[p0]; cp != int64(len(tc.adds)) {
				t.Fatalf("commit point %d, want %d", cp, len(tc.adds))
			}
		})
	}
}
