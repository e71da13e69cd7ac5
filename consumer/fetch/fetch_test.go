package fetch

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestFetchSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ratio float64
		want  int32
	}{
		{0, Budget}, {1, Budget}, {2, Budget / 2}, {8, Budget / 8}, {Budget / fetchFloor * 4, fetchFloor}, {1000, fetchFloor},
	} {
		if got := fetchSize(tc.ratio); got != tc.want {
			t.Errorf("fetchSize(%v) = %d, want %d", tc.ratio, got, tc.want)
		}
	}
}

// TestFetchSizerWindows: the size changes once a budget of records has
// been read, by the window's ratio of records to wire bytes, ignores
// changes under an eighth, is not pulled down by one very compressed batch
// among uncompressed ones, and comes back up when batches are no longer
// compressed.
func TestFetchSizerWindows(t *testing.T) {
	t.Parallel()
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	f := NewSizer(g, nil)
	f.SetClient(cl)
	// The steps were written for a budget of 4 MiB; sizes scale with it.
	q := func(n int) int { return n * Budget / (4 << 20) }
	batch := func(uncompressed, compressed int) {
		f.OnFetchBatchRead(kgo.BrokerMetadata{}, "t", 0, kgo.FetchBatchMetrics{UncompressedBytes: q(uncompressed), CompressedBytes: q(compressed)})
	}
	const b = Budget
	steps := []struct {
		name  string
		feed  func()
		wantG float64
	}{
		{"at first", func() {}, b},
		{"half a window, compressed 8 times", func() { batch(2<<20, 256<<10) }, b},
		// 832 KiB on the wire; the batches compressed 16 times are less
		// than a tenth of it, with those compressed 8 times more: 3 MiB
		// over 320 KiB.
		{"a window: the most compressed tenth", func() { batch(1<<20, 64<<10); batch(1<<20, 512<<10) }, float64(fetchSize(9.6))},
		{"compressed 10 times: within an eighth, unchanged", func() { batch(4<<20, 4<<20/10) }, float64(fetchSize(9.6))},
		{"uncompressed again", func() { batch(4<<20, 4<<20) }, b},
		{"one very compressed batch among uncompressed ones", func() { batch(4<<20-100<<10, 4<<20-100<<10); batch(100<<10, 1<<10) }, b},
		{"a sixth of the wire bytes compressed 10 times", func() { batch(3<<20, 3<<20/10); batch(3<<19, 3<<19) },
			float64(fetchSize(float64(q(3<<20)) / float64(q(3<<20/10))))},
	}
	for _, s := range steps {
		s.feed()
		if got := testutil.ToFloat64(g); got != s.wantG {
			t.Fatalf("%s: fetch size %v, want %v", s.name, got, s.wantG)
		}
	}
}

func TestDecompressPoolClasses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int
		want int
		ok   bool
	}{{1, 0, true}, {4096, 0, true}, {4097, 1, true}, {8192, 1, true}, {16 << 20, 12, true}, {16<<20 + 1, 13, false}} {
		if c, ok := poolClass(tc.n); c != tc.want || ok != tc.ok {
			t.Errorf("poolClass(%d) = %d, %v; want %d, %v", tc.n, c, ok, tc.want, tc.ok)
		}
	}
	// Batches of every size, larger ones compressing better, as franz-go
	// uses the pool: a buffer asked for, grown when the batch does not
	// fit, observed, and given back whole. Once the pool has seen a few,
	// batches fit the buffer they are given, and no buffer is more than
	// eight times what its batch needs.
	p := &DecompressPool{}
	rng := rand.New(rand.NewPCG(1, 2))
	big := make([]byte, 256<<10)
	var out [][]byte
	grown, gets := 0, 0
	for i := range 6_000 {
		if len(out) > 20 || (len(out) > 0 && rng.IntN(2) == 0) {
			j := rng.IntN(len(out))
			p.PutDecompressBytes(out[j][:cap(out[j])])
			out = append(out[:j], out[j+1:]...)
			continue
		}
		wire := 100 + rng.IntN(len(big)-100)
		if rng.IntN(4) == 0 {
			wire = 50 + rng.IntN(1000) // single records
		}
		ratio := (2 + 30*float64(wire)/float64(len(big))) * (0.9 + 0.2*rng.Float64())
		need := int(float64(wire) * ratio)
		b := p.GetDecompressBytes(big[:wire], kgo.CodecLz4)
		if len(b) != 0 {
			t.Fatalf("a buffer of length %d", len(b))
		}
		if i > 2_000 {
			gets++
			if cap(b) < need+bytes.MinRead {
				grown++
			}
			if cap(b) > 8*need+bytes.MinRead {
				t.Fatalf("a batch of %d bytes was given %d", need, cap(b))
			}
		}
		if cap(b) < need+bytes.MinRead { // bytes.Buffer.ReadFrom grows without that room
			b = append(b[:cap(b)], make([]byte, need+bytes.MinRead-cap(b))...)
		}
		p.observe(wire, need)
		out = append(out, b[:need])
	}
	if grown > gets/10 {
		t.Errorf("%d of %d batches did not fit their buffer", grown, gets)
	}
}

func TestRecordsPool(t *testing.T) {
	t.Parallel()
	p := &RecordsPool{}
	for _, n := range []int{0, 1, 2, 3, 100, 128, 129, 32_768, 32_769, 100_000} {
		rs := p.GetRecords(n)
		if len(rs) != 0 || cap(rs) < n {
			t.Fatalf("GetRecords(%d): len %d cap %d", n, len(rs), cap(rs))
		}
		if n > 0 && n <= 1<<(recordClasses-1) && cap(rs) >= 2*n && cap(rs) > 1 {
			t.Fatalf("GetRecords(%d): cap %d, more than twice what was asked", n, cap(rs))
		}
		p.PutRecords(rs[:n])
	}
	// A slice given back serves any request its class holds: never one
	// larger than its capacity.
	p.PutRecords(make([]kgo.Record, 5, 100)) // class 64 (6): 100 fills 64
	for range 10 {
		if rs := p.GetRecords(64); cap(rs) < 64 {
			t.Fatalf("GetRecords(64) gave cap %d", cap(rs))
		}
		if rs := p.GetRecords(65); cap(rs) < 65 {
			t.Fatalf("GetRecords(65) gave cap %d", cap(rs))
		}
	}
}
