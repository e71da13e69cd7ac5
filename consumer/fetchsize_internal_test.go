package consumer

import (
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestFetchSize(t *testing.T) {
	for _, tc := range []struct {
		ratio float64
		want  int32
	}{
		{0, 4 << 20}, {1, 4 << 20}, {2, 2 << 20}, {16, 256 << 10}, {64, 64 << 10}, {1000, 64 << 10},
	} {
		if got := fetchSize(tc.ratio); got != tc.want {
			t.Errorf("fetchSize(%v) = %d, want %d", tc.ratio, got, tc.want)
		}
	}
}

// TestFetchSizerWindows: the size changes once a budget of records has
// been read, follows the most compressed batch of the window, ignores
// changes under an eighth, and comes back up when batches are no longer
// compressed.
func TestFetchSizerWindows(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	f := newFetchSizer(g)
	f.client.Store(cl)
	batch := func(uncompressed, compressed int) {
		f.OnFetchBatchRead(kgo.BrokerMetadata{}, "t", 0, kgo.FetchBatchMetrics{UncompressedBytes: uncompressed, CompressedBytes: compressed})
	}
	steps := []struct {
		name  string
		feed  func()
		wantG float64
	}{
		{"at first", func() {}, 4 << 20},
		{"half a window, compressed 8 times", func() { batch(2<<20, 256<<10) }, 4 << 20},
		{"a window, one batch 16 times", func() { batch(1<<20, 64<<10); batch(1<<20, 512<<10) }, 256 << 10},
		{"a little less compressed: unchanged", func() { batch(4<<20, 4<<20/15) }, 256 << 10},
		{"uncompressed again", func() { batch(4<<20, 4<<20) }, 4 << 20},
	}
	for _, s := range steps {
		s.feed()
		if got := testutil.ToFloat64(g); got != s.wantG {
			t.Fatalf("%s: fetch size %v, want %v", s.name, got, s.wantG)
		}
	}
}

func TestDecompressPoolClasses(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want int
		ok   bool
	}{{1, 0, true}, {4096, 0, true}, {4097, 1, true}, {8192, 1, true}, {16 << 20, 12, true}, {16<<20 + 1, 13, false}} {
		if c, ok := poolClass(tc.n); c != tc.want || ok != tc.ok {
			t.Errorf("poolClass(%d) = %d, %v; want %d, %v", tc.n, c, ok, tc.want, tc.ok)
		}
	}
	// Whatever a class holds, a buffer handed out holds what was asked:
	// buffers of every capacity go in, and every request comes out big
	// enough and empty.
	p := &decompressPool{}
	rng := rand.New(rand.NewPCG(1, 2))
	big := make([]byte, 256<<10)
	for range 4_000 {
		if rng.IntN(2) == 0 {
			p.PutDecompressBytes(make([]byte, rng.IntN(100), 1+rng.IntN(4<<20)))
			continue
		}
		compressed := big[:rng.IntN(len(big))]
		b := p.GetDecompressBytes(compressed, kgo.CodecLz4)
		if want := max(int(p.typical.Load()), 2*len(compressed)); len(b) != 0 || cap(b) < want {
			t.Fatalf("asked for %d bytes: len %d cap %d", want, len(b), cap(b))
		}
	}
}
