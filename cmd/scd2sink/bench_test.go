package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkPipeline runs the real binary over 250,000 Debezium events
// (50,000 keys, 10% Type-1-only updates) already in an in-process Kafka,
// until every offset is applied; then COPYs the resulting history rows into
// a table of the same shape and indexes. It reports the binary's events/s
// (from its first applied batch to its last), the COPY rows/s, their ratio
// and the binary's peak RSS. Two shapes of the same events:
//   - schemaless: compact JSON without schema (JsonConverter schemas.enable=false);
//   - debezium-json: what a Debezium 3.6 PostgreSQL connector writes with
//     schemas on (about 4.6 KB: schema, full source block, before null),
//     for a table with numeric, date, timestamptz, jsonb and a text of a few
//     hundred bytes.
func BenchmarkPipeline(b *testing.B) {
	const nKeys, nEvents = 50_000, 250_000
	evs := scdtest.BenchEvents(rand.New(rand.NewPCG(1, 2)), "customers_history", nKeys, nEvents, 100)
	b.Run("schemaless", func(b *testing.B) {
		recs := make([]*kgo.Record, len(evs))
		for i, ev := range evs {
			k, v := scdtest.Debezium(ev, []string{"id"})
			recs[i] = &kgo.Record{Topic: "bench.customers", Key: k, Value: v}
		}
		benchPipeline(b, recs, scdtest.BenchColumns)
	})
	b.Run("debezium-json", func(b *testing.B) {
		src := benchSource()
		recs := make([]*kgo.Record, len(evs))
		for i, ev := range evs {
			k, v := src.Envelope(benchChange(ev))
			recs[i] = &kgo.Record{Topic: "bench.customers", Key: k, Value: v}
		}
		b.Logf("envelopes of %d bytes on average", avgSize(recs))
		cols := append([]string{"balance", "birth", "signed_up", "attrs", "bio"}, scdtest.BenchColumns...)
		benchPipeline(b, recs, cols)
	})
}

func avgSize(recs []*kgo.Record) int {
	n := 0
	for _, r := range recs {
		n += len(r.Key) + len(r.Value)
	}
	return n / len(recs)
}

// benchSource is the benchmark table as Debezium describes it.
func benchSource() *scdtest.Source {
	return &scdtest.Source{Server: "bench", DB: "bench", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{
			{Name: "id", Schema: `{"type":"int64","optional":false}`},
			{Name: "name", Schema: `{"type":"string","optional":true}`},
			{Name: "plan", Schema: `{"type":"string","optional":true}`},
			{Name: "city", Schema: `{"type":"string","optional":true}`},
			{Name: "score", Schema: `{"type":"int64","optional":true}`},
			{Name: "balance", Schema: `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"12"}}`},
			{Name: "birth", Schema: `{"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1}`},
			{Name: "signed_up", Schema: `{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1}`},
			{Name: "attrs", Schema: `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`},
			{Name: "bio", Schema: `{"type":"string","optional":true}`},
		}}
}

// benchChange renders a benchmark event as the connector reports it.
func benchChange(ev *change.Event) scdtest.Change {
	id, _ := strconv.ParseInt(fmt.Sprint(ev.Key[0]), 10, 64)
	lsn, _ := strconv.ParseInt(ev.Seq.Parts()[0], 10, 64)
	row := scdtest.Row{"balance": scdtest.DecimalB64(strconv.FormatInt(id*137%1000000-500000, 10)),
		"birth": 20000 - int(id%20000), "signed_up": scdtest.Zoned(time.Date(2024, 1, 1, 0, 0, int(id), 0, time.UTC)),
		"attrs": fmt.Sprintf(`{"tier": %d, "tags": ["a", "b"], "score": 1.10}`, id%5),
		"bio":   strings.Repeat(fmt.Sprintf("Customer %d likes long walks. ", id), 10)}
	for k, v := range ev.After {
		if n, ok := v.(json.Number); ok {
			i, _ := n.Int64()
			row[k] = i
		} else {
			row[k] = v
		}
	}
	op := "u"
	if ev.Op == change.OpRead {
		op = "r"
	}
	return scdtest.Change{Op: op, After: row, LSN: lsn * 8, TxID: lsn, Commit: ev.ValidFrom}
}

func benchPipeline(b *testing.B, recs []*kgo.Record, copyCols []string) {
	const partitions = 6
	nEvents := int64(len(recs))
	ctx := context.Background()
	for iter := 0; iter < b.N; iter++ {
		kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "bench.customers"))
		if err != nil {
			b.Fatal(err)
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.ProducerBatchMaxBytes(1<<20))
		if err != nil {
			b.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
		cl.Close()
		dsn := pgtest.NewDatabase(b)
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		brokers, _ := json.Marshal(kafka.ListenAddrs())
		cfgFile := filepath.Join(b.TempDir(), "scd2sink.yaml")
		cfg := fmt.Sprintf(`kafka: {brokers: %s, group_id: bench}
postgres: {dsn: %q}
http: {addr: ""}
log: {level: warn}
tables:
  - topic: bench.customers
    target: customers_history
    keys: [id]
    track_history: [plan, city, score]
`, brokers, dsn)
		if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
			b.Fatal(err)
		}
		bin := binary(b)
		cmd := exec.Command(bin, "run", "--config", cfgFile)
		cmd.Stderr = os.Stderr
		cmd.Env = append(os.Environ(), os.Getenv("BENCH_ENV"))
		b.StartTimer()
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		hwm := watchHWM(cmd.Process.Pid)
		var first, at10, at90 time.Time
		var applied int64
		for applied < nEvents {
			time.Sleep(10 * time.Millisecond)
			_ = pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets`).Scan(&applied)
			if applied > 0 && first.IsZero() {
				first = time.Now()
			}
			if applied >= nEvents/10 && at10.IsZero() {
				at10 = time.Now()
			}
			if applied >= nEvents*9/10 && at90.IsZero() {
				at90 = time.Now()
			}
			if time.Since(start) > 10*time.Minute {
				b.Fatal("not applied within 10 minutes")
			}
		}
		done := time.Now()
		b.StopTimer()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("scd2sink: %v", err)
		}
		// Not rusage's Maxrss: with vfork it counts the test process's own
		// pages from before the exec. VmHWM is the binary's own peak.
		rssMiB := float64(<-hwm) / 1024
		var versions int64
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM customers_history`).Scan(&versions)
		copyRows, copyDur := scdtest.CopyBaseline(b, pool, pgx.Identifier{"customers_history"}, pgx.Identifier{"copy_target"}, copyCols, 10_000)
		steady := done.Sub(first)
		eps := float64(nEvents) / steady.Seconds()
		sustained := float64(nEvents*8/10) / at90.Sub(at10).Seconds()
		rps := float64(copyRows) / copyDur.Seconds()
		b.ReportMetric(eps, "events/s")
		b.ReportMetric(rps, "copy_rows/s")
		b.ReportMetric(eps/rps, "ratio")
		b.ReportMetric(sustained/rps, "sustained_ratio")
		b.ReportMetric(rssMiB, "peak_rss_MiB")
		b.Logf("%d events -> %d versions: %s from start (%s from the first applied batch, the last reorder window included): %.0f events/s; "+
			"sustained (10%% to 90%% applied) %.0f events/s; COPY %d rows in %s: %.0f rows/s; ratio %.2f (sustained %.2f); peak RSS %.0f MiB",
			nEvents, versions, done.Sub(start).Round(time.Millisecond), steady.Round(time.Millisecond), eps,
			sustained, copyRows, copyDur.Round(time.Millisecond), rps, eps/rps, sustained/rps, rssMiB)
		pool.Close()
		kafka.Close()
	}
}

// watchHWM samples /proc/pid/status until the process is gone and sends
// the last peak resident set size (VmHWM) seen, in KiB.
func watchHWM(pid int) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		var peak int64
		for {
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil || !strings.Contains(string(st), "VmHWM") {
				out <- peak
				return
			}
			for _, l := range strings.Split(string(st), "\n") {
				if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
					if v, err := strconv.ParseInt(f[1], 10, 64); err == nil && v > peak {
						peak = v
					}
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return out
}
