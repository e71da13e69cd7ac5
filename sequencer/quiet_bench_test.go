package sequencer

import (
	"fmt"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// BenchmarkReleaseQuietPartial: 20,000 keys of a busy table buffered, and
// one event of a quiet table released per call, as a poll does while one
// table's input is quiet and another's is not.
func BenchmarkReleaseQuietPartial(b *testing.B) {
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := New(Config{ReorderWindow: time.Hour}, clk.now)
	for k := range 20_000 {
		s.Add(ev(p0, int64(k), fmt.Sprintf("b%d", k), 1, "v"))
	}
	q := change.Partition{Topic: "q", Partition: 0}
	isQuiet := func(table string) bool { return table == "quiet" }
	b.ResetTimer()
	for i := range b.N {
		e := ev(q, int64(i), "q", int64(i+1), "v")
		e.Table = "quiet"
		s.Add(e)
		if out := s.ReleaseQuiet(isQuiet); len(out.Events) != 1 {
			b.Fatalf("released %d events", len(out.Events))
		}
	}
}
