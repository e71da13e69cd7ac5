package sequencer

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// BenchmarkSequencer runs a backlog through the buffer as the consumer
// does: records of 6 partitions added a poll (500) at a time, each poll
// 2 ms apart on the clock, then Release; keys drawn from 50,000, as in
// BenchmarkPipeline; the byte budget of the default config, so that most
// events leave before their window, as in a backlog. It reports the
// sequencer's own cost per event.
func BenchmarkSequencer(b *testing.B) {
	const nKeys, nParts, poll = 50_000, 6, 500
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]string, nKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("C%06d", i)
	}
	parts := make([]change.Partition, nParts)
	for i := range parts {
		parts[i] = change.Partition{Topic: "shop.public.customers", Partition: int32(i)}
	}
	evs := make([]*change.Event, b.N)
	offsets := make([]int64, nParts)
	for i := range evs {
		k := rng.IntN(nKeys)
		p := k % nParts
		evs[i] = &change.Event{
			Table:     "customers_history",
			Key:       []any{keys[k]},
			Seq:       change.MustSeq(int64(1000 + i)),
			Op:        change.OpUpdate,
			AfterJSON: make([]byte, 400),
			Origin:    change.Origin{Partition: parts[p], Offset: offsets[p]},
		}
		offsets[p]++
	}
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := New(Config{ReorderWindow: 2 * time.Second, MaxBufferedEvents: 200_000, MaxBufferedBytes: 16 << 20}, clk.now)
	released := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i, e := range evs {
		s.Add(e)
		if (i+1)%poll == 0 {
			clk.advance(2 * time.Millisecond)
			released += len(s.Release().Events)
			_ = s.CommitPoints()
		}
	}
	released += len(s.Flush().Events)
	b.StopTimer()
	if released != b.N {
		b.Fatalf("released %d of %d events", released, b.N)
	}
}
