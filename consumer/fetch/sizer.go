package fetch

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Budget bounds what one fetch holds once decompressed: franz-go
// decompresses a whole fetch as it arrives and holds it ahead of the
// sequencer, so this is memory the reorder buffer's budget does not count.
// It was 4 MiB: a fetch of uncompressed records is a new buffer of that
// size, which lives until the consumer has decoded its last record, and the
// collector had that much less room (docs/benchmarks.md: 1 MiB cut the
// collections by about 5 % at the same throughput, against a real broker
// too).
const Budget = 1 << 20

// MaxConcurrent is how many fetches franz-go may have in flight or
// buffered at once, each to its own broker: franz-go holds at most that
// many Budgets ahead of the reorder buffer.
const MaxConcurrent = 4

// fetchFloor is the least a fetch asks for. A broker returns at least one
// record batch of a partition even when it is larger (KIP-74), so a small
// floor never stops progress; it only keeps fetches from becoming tiny.
const fetchFloor = 64 << 10

// PartitionMax is franz-go's default per-partition limit, kept.
const PartitionMax = 1 << 20

// Sizer keeps what a fetch decompresses to near Budget. Kafka's
// fetch limits count the bytes on the wire, and Debezium's JSON with
// schemas compresses 20 to 40 times with lz4 or zstd (the schema repeats
// in every record): a 4 MiB fetch of such batches held 80 MiB of records,
// and the collector, bounded by the soft memory limit, ran four times as
// often (docs/benchmarks.md). After every Budget of records read, the
// fetch size becomes Budget divided by the ratio of records to wire
// bytes of the most compressed batches that make up a tenth of the
// window's wire bytes (ratioShare), between fetchFloor and Budget;
// uncompressed topics keep Budget. A tenth, not the single most
// compressed batch: one repetitive batch among uncompressed ones must not
// throttle them all. A fetch that holds only batches more compressed than
// that ratio holds more than the budget, by their ratio over it.
//
// franz-go calls OnFetchBatchRead from its fetch goroutines; the client is
// set once the consumer has it (SetClient; a fetch before that only counts).
type Sizer struct {
	client atomic.Pointer[kgo.Client]
	gauge  prometheus.Gauge // nil: none
	pool   *DecompressPool  // told every compressed batch's sizes; nil: none

	mu   sync.Mutex
	read int                  // uncompressed bytes read since the size was last set
	wire int                  // and their bytes on the wire
	by   [ratioBuckets][2]int // the same, by the batches' ratio (ratioBucket)
	size int32                // the fetch size asked for now
}

// ratioBuckets group batches by ratio: under 2, 2 to 4, ... 64 and over.
const ratioBuckets = 7

// ratioShare is the share of a window's wire bytes, from its most
// compressed batches, whose ratio sizes the fetch.
const ratioShare = 0.1

func ratioBucket(uncompressed, wire int) int {
	return min(ratioBuckets-1, max(0, bits.Len(uint(uncompressed/wire))-1))
}

// windowRatio is the ratio of records to wire bytes of the most compressed
// batches that make up ratioShare of the window's wire bytes (whole
// buckets, so at least that share).
func (f *Sizer) windowRatio() float64 {
	var read, wire int
	for b := ratioBuckets - 1; b >= 0; b-- {
		read, wire = read+f.by[b][0], wire+f.by[b][1]
		if float64(wire) >= ratioShare*float64(f.wire) {
			break
		}
	}
	return float64(read) / float64(wire)
}

var _ kgo.HookFetchBatchRead = (*Sizer)(nil)

// NewSizer returns a Sizer that starts at Budget, sets gauge (nil: none)
// to the fetch size it asks for, and tells pool (nil: none) the sizes of
// every compressed batch. Hook it into the client (kgo.WithHooks) and give
// it the client once made (SetClient).
func NewSizer(gauge prometheus.Gauge, pool *DecompressPool) *Sizer {
	f := &Sizer{gauge: gauge, pool: pool, size: Budget}
	if gauge != nil {
		gauge.Set(Budget)
	}
	return f
}

// SetClient gives f the client whose fetch size it sets.
func (f *Sizer) SetClient(cl *kgo.Client) { f.client.Store(cl) }

// OnFetchBatchRead implements kgo.HookFetchBatchRead.
func (f *Sizer) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	if m.CompressedBytes <= 0 || m.UncompressedBytes <= 0 {
		return
	}
	if f.pool != nil && m.CompressionType != 0 {
		f.pool.observe(m.CompressedBytes, m.UncompressedBytes)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.read += m.UncompressedBytes
	f.wire += m.CompressedBytes
	b := &f.by[ratioBucket(m.UncompressedBytes, m.CompressedBytes)]
	b[0], b[1] = b[0]+m.UncompressedBytes, b[1]+m.CompressedBytes
	if f.read < Budget {
		return
	}
	size := fetchSize(f.windowRatio())
	f.read, f.wire, f.by = 0, 0, [ratioBuckets][2]int{}
	// Within an eighth of the current size: not worth a change (a ratio
	// that wavers would otherwise change it on every window).
	if d := size - f.size; d > f.size/8 || -d > f.size/8 {
		cl := f.client.Load()
		if cl == nil {
			return
		}
		f.size = size
		cl.UpdateFetchMaxBytes(size, min(size, PartitionMax))
		if f.gauge != nil {
			f.gauge.Set(float64(size))
		}
	}
}

// fetchSize is the fetch size for batches that decompress ratio times.
func fetchSize(ratio float64) int32 {
	if ratio <= 1 {
		return Budget
	}
	return int32(max(fetchFloor, min(Budget, float64(Budget)/ratio)))
}
