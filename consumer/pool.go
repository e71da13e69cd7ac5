package consumer

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Buffers of compressed batches' records are taken from decompressPool
// and given back when every record of the batch has been recycled, which
// take does once the records are decoded (kgo.Record.Recycle): a backlog of
// lz4 batches otherwise allocated its whole size again (1.1 GB over
// BenchmarkPipeline's backlog), and the collector ran more often. Nothing
// decoded may keep a record's bytes: the decoder copies what it keeps
// (debezium's TestDecodedEventsOwnTheirMemory), and a dead letter takes
// copies. Uncompressed batches are not pooled by franz-go: their records
// view the fetch response, which the collector frees.
//
// A buffer is asked for at the size batches of about the same size on the
// wire have decompressed to lately (a maximum that decays: producers cut
// batches at a size of their own, which compress to sizes near each
// other), from power-of-two classes: buffers of every size are reused
// where they fit, and a small batch is not given a buffer sized for a
// large one. One too small is grown by franz-go, and the grown one kept in
// its class.
type decompressPool struct {
	classes [poolClasses]sync.Pool
	// sizes are, per class of wire size (sizeClass), the decaying maximum
	// of what batches decompressed to; 0: none seen.
	sizes [sizeClasses]atomic.Int64
}

// sizeClasses are classes of wire size: up to 1 KiB, 2 KiB, ... 32 MiB.
const sizeClasses = 16

func sizeClass(wire int) int {
	return min(sizeClasses-1, max(0, bits.Len(uint(max(wire, 1)-1))-10))
}

// observe notes a batch's bytes on the wire and decompressed (the fetch
// sizer's hook sees every batch). Concurrent notes may lose one: a sample
// less.
func (p *decompressPool) observe(wire, decompressed int) {
	if wire <= 0 || decompressed <= 0 {
		return
	}
	s := &p.sizes[sizeClass(wire)]
	s.Store(max(int64(decompressed), s.Load()-s.Load()/64))
}

const (
	poolMinShift = 12 // 4 KiB
	poolClasses  = 13 // up to 16 MiB; a larger batch's buffer is not kept
)

var _ kgo.PoolDecompressBytes = (*decompressPool)(nil)

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
func (p *decompressPool) GetDecompressBytes(compressed []byte, _ kgo.CompressionCodecType) []byte {
	want := int(p.sizes[sizeClass(len(compressed))].Load())
	if want == 0 {
		want = 8 * len(compressed) // none seen yet at this size
	}
	want = max(want, len(compressed))
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
func (p *decompressPool) PutDecompressBytes(b []byte) {
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
