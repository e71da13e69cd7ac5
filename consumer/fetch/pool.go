package fetch

import (
	"bytes"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// DecompressPool pools the buffers franz-go decompresses record batches
// into (kgo.PoolDecompressBytes). Buffers of compressed batches' records
// are taken from DecompressPool and given back when every record of the
// batch has been recycled, which the consumer's take does once the
// records are decoded (kgo.Record.Recycle): a backlog of
// lz4 batches otherwise allocated its whole size again (1.1 GB over
// BenchmarkPipeline's backlog), and the collector ran more often. Nothing
// decoded may keep a record's bytes: the decoder copies what it keeps
// (debezium's TestDecodedEventsOwnTheirMemory), and a dead letter takes
// copies. Uncompressed batches' bytes are not pooled by franz-go: their
// records view the fetch response, which the collector frees. The record
// structs themselves are pooled for every batch (RecordsPool).
//
// A buffer is asked for at the batch's bytes on the wire times the mean
// ratio batches of about that wire size have decompressed by, plus half,
// but not above the largest size they decompressed to lately (a maximum
// that decays), plus the spare room franz-go's readers want
// (bytes.MinRead). Buffers come from power-of-two classes: every size is
// reused where it fits, and a small batch is not given a buffer sized for
// a large one. One too small is grown by franz-go, and the grown one kept
// in its class. A buffer under the smallest class (single-record batches)
// is made to measure and not kept. Topics that compress very differently
// in batches of the same wire size share a mean: the less compressed one's
// buffers are then larger than they need, by the ratio of the two.
type DecompressPool struct {
	classes [poolClasses]sync.Pool
	sizes   [sizeClasses]sizeStats // by class of wire size (sizeClass)
}

// sizeStats are what batches of one class of wire size decompressed to.
type sizeStats struct {
	max   atomic.Int64  // a decaying maximum of their sizes; 0: none seen
	ratio atomic.Uint64 // the running mean of their ratios (math.Float64bits)
}

// sizeClasses are classes of wire size: up to 1 KiB, 2 KiB, ... 32 MiB.
const sizeClasses = 16

func sizeClass(wire int) int {
	return min(sizeClasses-1, max(0, bits.Len(uint(max(wire, 1)-1))-10))
}

// observe notes a batch's bytes on the wire and decompressed (the fetch
// sizer's hook sees every batch). Concurrent notes may lose one: a sample
// less.
func (p *DecompressPool) observe(wire, decompressed int) {
	if wire <= 0 || decompressed <= 0 {
		return
	}
	st := &p.sizes[sizeClass(wire)]
	m := st.max.Load()
	st.max.Store(max(int64(decompressed), m-m/64))
	r, old := float64(decompressed)/float64(wire), math.Float64frombits(st.ratio.Load())
	if old == 0 {
		old = r
	}
	st.ratio.Store(math.Float64bits(old + (r-old)/16))
}

const (
	poolMinShift = 12 // the smallest class: buffers of 4 KiB (to 8 KiB)
	poolClasses  = 13 // the largest: 16 MiB (to 32 MiB); a larger buffer is not kept
)

var _ kgo.PoolDecompressBytes = (*DecompressPool)(nil)

// poolClass returns the class whose buffers hold at least n bytes, and false
// when n is over the largest.
func poolClass(n int) (int, bool) {
	if n <= 1<<poolMinShift {
		return 0, true
	}
	c := bits.Len(uint(n-1)) - poolMinShift
	return c, c < poolClasses
}

// GetDecompressBytes implements kgo.PoolDecompressBytes: a buffer for what
// compressed should decompress to. A buffer too small is grown by franz-go
// and the grown one put back.
func (p *DecompressPool) GetDecompressBytes(compressed []byte, _ kgo.CompressionCodecType) []byte {
	st := &p.sizes[sizeClass(len(compressed))]
	want := min(8*len(compressed), 16<<20) // none seen yet at this size
	if ratio := math.Float64frombits(st.ratio.Load()); ratio > 0 {
		want = min(int(st.max.Load()), int(float64(len(compressed))*ratio*1.5))
	}
	want = max(want, len(compressed)) + bytes.MinRead
	if want < 1<<poolMinShift {
		return make([]byte, 0, want)
	}
	c, ok := poolClass(want)
	if !ok {
		return make([]byte, 0, want)
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, 1<<(c+poolMinShift))
}

// PutDecompressBytes implements kgo.PoolDecompressBytes. franz-go gives
// back the whole capacity, cleared.
func (p *DecompressPool) PutDecompressBytes(b []byte) {
	// A buffer goes to the largest class it fills, so that every buffer
	// a class hands out holds its class's size.
	n := cap(b)
	if n < 1<<poolMinShift {
		return
	}
	c := bits.Len(uint(n)) - 1 - poolMinShift
	if c >= poolClasses {
		return
	}
	p.classes[c].Put(&b)
}

// RecordsPool keeps the slices franz-go decodes a batch's records into
// (kgo.PoolRecords), by power-of-two capacity: a slice comes back once
// every record of its batch is recycled, which the consumer's take does
// for all of them.
// Without it every batch's records were a new slice (about 170 bytes a
// record: 45 MB over BenchmarkPipeline's backlog). A request over the
// largest class gets a slice made to measure; a slice goes back to the
// largest class it fills, and one of 65,536 records or more is not kept.
type RecordsPool struct {
	classes [recordClasses]sync.Pool
}

// recordClasses: slices of 1, 2, 4, ... 32,768 records.
const recordClasses = 16

var _ kgo.PoolRecords = (*RecordsPool)(nil)

// GetRecords implements kgo.PoolRecords: a slice of capacity n or more.
func (p *RecordsPool) GetRecords(n int) []kgo.Record {
	c := bits.Len(uint(max(n, 1) - 1))
	if c >= recordClasses {
		return make([]kgo.Record, 0, n)
	}
	if rs, ok := p.classes[c].Get().(*[]kgo.Record); ok {
		return (*rs)[:0]
	}
	return make([]kgo.Record, 0, 1<<c)
}

// PutRecords implements kgo.PoolRecords. franz-go gives a slice back when
// all its records are recycled (kgo.Record.Recycle clears each).
func (p *RecordsPool) PutRecords(rs []kgo.Record) {
	n := cap(rs)
	if n == 0 {
		return
	}
	c := bits.Len(uint(n)) - 1 // the largest class it fills
	if c >= recordClasses {
		return
	}
	rs = rs[:0]
	p.classes[c].Put(&rs)
}
