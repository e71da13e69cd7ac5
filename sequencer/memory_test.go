package sequencer

import (
	"context"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
)

// TestBudgetCountsMemory checks that the byte budget counts what the
// buffer really holds: events decoded from real-shaped Debezium envelopes
// (JsonConverter, schemas on), buffered, against the heap they keep alive
// (the events, their images, the buffer's own books). max_buffered_bytes
// is documented as a bound on the buffer's memory, so the estimate must
// neither undercount (the heap outgrows the limit the collector is tuned
// for) nor overcount much (the buffer holds less than it may).
func TestBudgetCountsMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("decodes 20,000 envelopes")
	}
	for _, tc := range []struct {
		name           string
		nKeys, nEvents int
	}{
		{"one event per key (a snapshot)", 10_000, 10_000},
		{"three events per key", 10_000, 30_000},
	} {
		t.Run(tc.name, func(t *testing.T) { testBudgetCountsMemory(t, tc.nKeys, tc.nEvents) })
	}
}

func testBudgetCountsMemory(t *testing.T, nKeys, nEvents int) {
	work := scdtest.BenchWorkload(rand.New(rand.NewPCG(3, 4)), nKeys, nEvents)
	var rules []debezium.Rule
	for _, src := range []*scdtest.Source{scdtest.BenchCustomers(), scdtest.BenchAccounts()} {
		rules = append(rules, debezium.Rule{Topic: src.Topic(), Target: src.Table + "_history",
			SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"})
	}
	dec := debezium.New(rules, nil, nil)
	type rec struct {
		o    change.Origin
		k, v []byte
	}
	recs := make([]rec, 0, len(work))
	offs := map[string]int64{}
	for _, w := range work {
		if w.Tombstone {
			continue
		}
		k, v := w.Src.Envelope(w.Change)
		topic := w.Src.Topic()
		recs = append(recs, rec{change.Origin{Partition: change.Partition{Topic: topic}, Offset: offs[topic]}, k, v})
		offs[topic]++
	}
	// Warm the decoder's caches (schemas, rules) outside the measurement.
	for _, r := range recs[:100] {
		if _, err := dec.Decode(context.Background(), r.o, r.k, r.v); err != nil {
			t.Fatal(err)
		}
	}
	s := New(Config{ReorderWindow: time.Hour}, nil)
	before := liveHeap()
	for _, r := range recs {
		ev, err := dec.Decode(context.Background(), r.o, r.k, r.v)
		if err != nil {
			t.Fatal(err)
		}
		s.Add(ev)
	}
	after := liveHeap()
	runtime.KeepAlive(recs)
	if s.Len() != len(recs) {
		t.Fatalf("%d events buffered, want %d", s.Len(), len(recs))
	}
	onHeap := float64(after-before) / float64(s.Len())
	counted := float64(s.Bytes()) / float64(s.Len())
	t.Logf("%d events, %d keys: %.0f bytes per event on the heap, %.0f counted (%.2f)", s.Len(), len(s.keys), onHeap, counted, counted/onHeap)
	if counted < 0.9*onHeap || counted > 1.15*onHeap {
		t.Fatalf("the budget counts %.0f bytes per buffered event, the heap grew by %.0f: off by more than the allowed -10%%..+15%%", counted, onHeap)
	}
	runtime.KeepAlive(s)
}

// liveHeap returns the bytes of live heap objects after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
