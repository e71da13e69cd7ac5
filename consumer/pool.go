package consumer

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Buffers of compressed batches' records are taken from decompressPool
// and given back when every record of the batch has been recycled, which
// take does once the records are decoded (kgo.Record.Recycle): a
// backlog of lz4 batches otherwise allocated its whole size again
// (1.1 GB over BenchmarkPipeline's backlog), and the collector ran half as
// often again. Nothing decoded may keep a record's bytes: the decoder
// copies what it keeps (debezium's TestDecodedEventsOwnTheirMemory), and
// a dead letter takes copies. Uncompressed batches are not pooled by
// franz-go: their records view the fetch response, which the collector
// frees.
//
// A buffer is asked for at the running mean of the sizes batches
// decompressed to (a topic's producers cut batches of much the same size:
// Kafka Connect's default is 16 KiB), from power-of-two classes so that
// buffers of every size are reused where they fit. One too small is grown
// by franz-go, and the grown one kept.
type decompressPool struct {
	classes [poolClasses]sync.Pool
	// typical is the running mean of the sizes batches decompressed to
	// (PutDecompressBytes sees them).
	typical atomic.Int64
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
	want := max(int(p.typical.Load()), 2*len(compressed))
	c, ok := poolClass(want)
	if !ok {
		return make([]byte, 0, want)
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, 1<<(c+poolMinShift))
}

// PutDecompressBytes implements kgo.PoolDecompressBytes.
func (p *decompressPool) PutDecompressBytes(b []byte) {
	if t := p.typical.Load(); t == 0 {
		p.typical.Store(int64(len(b)))
	} else {
		p.typical.Store(t + (int64(len(b))-t)/8) // racy updates lose a sample at worst
	}
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
