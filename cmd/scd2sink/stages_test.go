package main

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// The pipeline's stages, as a CPU profile's stacks show them.
var stageNames = []string{"fetch", "decode", "sequencer", "prepare", "apply", "gc", "other"}

// stageOf names the stage a sample's stack (leaf first) belongs to:
//   - gc: the collector's own goroutines and the assists it takes from
//     allocating code (the price of the allocations, wherever they are);
//   - prepare: sink.Prepare, the batch's CPU half on the poll loop (row
//     images, fold, COPY rows);
//   - apply: sink.ApplyPrepared and pgx, the transaction;
//   - sequencer, decode (package debezium and the consumer's take loop),
//     fetch (franz-go and its decompression): the innermost such frame.
func stageOf(funcs []string) string {
	for _, f := range funcs {
		switch {
		case strings.HasPrefix(f, "runtime.gcBgMarkWorker"), strings.HasPrefix(f, "runtime.gcAssistAlloc"),
			strings.HasPrefix(f, "runtime.bgsweep"), strings.HasPrefix(f, "runtime.bgscavenge"),
			strings.HasPrefix(f, "runtime.gcStart"), strings.HasPrefix(f, "runtime.markroot"):
			return "gc"
		}
	}
	for _, f := range funcs {
		switch {
		case strings.Contains(f, "sink.(*Sink).Prepare"):
			return "prepare"
		case strings.Contains(f, "sink.(*Sink).ApplyPrepared"):
			return "apply"
		}
	}
	for _, f := range funcs {
		switch {
		case strings.Contains(f, "scd2sink/sequencer."):
			return "sequencer"
		case strings.Contains(f, "scd2sink/debezium."), strings.Contains(f, "consumer.(*Consumer).take"):
			return "decode"
		case strings.Contains(f, "jackc/pgx"), strings.Contains(f, "scd2sink/sink."):
			return "apply"
		case strings.Contains(f, "twmb/franz-go"), strings.Contains(f, "klauspost/compress"), strings.Contains(f, "pierrec/lz4"):
			return "fetch"
		}
	}
	return "other"
}

// stageCPU reads a CPU profile and returns the CPU time per stage, in
// nanoseconds, and the total.
func stageCPU(tb testing.TB, path string) (map[string]int64, int64) {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		tb.Fatalf("parsing %s: %v", path, err)
	}
	vi := len(p.SampleType) - 1 // cpu nanoseconds
	out := map[string]int64{}
	var total int64
	var funcs []string
	for _, s := range p.Sample {
		funcs = funcs[:0]
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if l.Function != nil {
					funcs = append(funcs, l.Function.Name)
				}
			}
		}
		v := s.Value[vi]
		out[stageOf(funcs)] += v
		total += v
	}
	return out, total
}

// reportStages reports the CPU per event of each stage as benchmark
// metrics and a log line.
func reportStages(b *testing.B, path string, events int64) {
	b.Helper()
	st, total := stageCPU(b, path)
	var parts []string
	for _, name := range stageNames {
		us := float64(st[name]) / 1e3 / float64(events)
		b.ReportMetric(us, name+"_µs/event")
		parts = append(parts, fmt.Sprintf("%s %.1f µs (%.0f%%)", name, us, 100*float64(st[name])/float64(total)))
	}
	b.ReportMetric(float64(total)/1e3/float64(events), "cpu_µs/event")
	b.Logf("CPU per event: %.1f µs in all; %s", float64(total)/1e3/float64(events), strings.Join(parts, ", "))
}

// scrape reads the named counters from a Prometheus text endpoint.
func scrape(tb testing.TB, url string, names ...string) map[string]float64 {
	tb.Helper()
	out, err := tryScrape(url, names...)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// tryScrape reads samples (name with labels, as exposed) from /metrics at
// url, within 5 s.
func tryScrape(url string, names ...string) (map[string]float64, error) {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && want[f[0]] {
			v, _ := strconv.ParseFloat(f[1], 64)
			out[f[0]] = v
		}
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("%s: no %s", url, n)
		}
	}
	return out, nil
}

func TestStageOf(t *testing.T) {
	t.Parallel()
	cases := []struct {
		stack []string
		want  string
	}{
		{[]string{"runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker"}, "gc"},
		{[]string{"runtime.mallocgc", "runtime.gcAssistAlloc", "github.com/scd2sink/scd2sink/debezium.(*Decoder).Decode"}, "gc"},
		{[]string{"github.com/tidwall/gjson.Parse", "github.com/scd2sink/scd2sink/debezium.(*Decoder).Decode", "github.com/scd2sink/scd2sink/consumer.(*Consumer).take.func3"}, "decode"},
		{[]string{"runtime.memmove", "github.com/scd2sink/scd2sink/sequencer.(*Sequencer).Add", "github.com/scd2sink/scd2sink/consumer.(*Consumer).take.func3"}, "sequencer"},
		{[]string{"github.com/scd2sink/scd2sink/internal/change.(*Event).DecodeAfter", "github.com/scd2sink/scd2sink/sink.(*Sink).Prepare"}, "prepare"},
		{[]string{"github.com/jackc/pgx/v5/pgconn.(*PgConn).CopyFrom", "github.com/scd2sink/scd2sink/sink.(*Sink).ApplyPrepared"}, "apply"},
		{[]string{"github.com/klauspost/compress/s2.s2Decode", "github.com/twmb/franz-go/pkg/kgo.(*cursorOffsetNext).processRespPartition"}, "fetch"},
		{[]string{"runtime.futex", "runtime.schedule"}, "other"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			if got := stageOf(c.stack); got != c.want {
				t.Fatalf("stageOf(%v) = %s, want %s", c.stack, got, c.want)
			}
		})
	}
}
