package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkLatency measures produce-to-visible latency at a steady rate:
// the real binary (reorder_window 200ms, batch_max_wait 250ms, the default) reads an
// in-process Kafka while this benchmark produces real-shaped Debezium JSON
// envelopes (scdtest.BenchWorkload) at 1,000 events/s for 20 s. It looks
// as a reader of the history would: every 20 ms it asks PostgreSQL which
// of the versions that produced events open (creates, snapshot reads,
// tracked updates) are in the history tables, by key and sequence, and
// takes the time from an event's produce call to the first poll that sees
// its version. It reports p50, p99 and the maximum, and p99 minus the
// reorder window (the goal: at most 50 ms).
func BenchmarkLatency(b *testing.B) {
	rate, seconds := envInt("LATENCY_RATE", 1000), envInt("LATENCY_SECONDS", 20) // events/s, for how long
	const window, wait = 200 * time.Millisecond, 250 * time.Millisecond          // wait: the default
	work := scdtest.BenchWorkload(rand.New(rand.NewPCG(3, 4)), 5_000, rate*seconds)
	ctx := context.Background()
	for iter := 0; iter < b.N; iter++ {
		kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, scdtest.BenchCustomers().Topic(), scdtest.BenchAccounts().Topic()))
		if err != nil {
			b.Fatal(err)
		}
		dsn := pgtest.NewDatabase(b)
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		cfgFile := filepath.Join(b.TempDir(), "scd2sink.yaml")
		extra := fmt.Sprintf("sequencer: {reorder_window: %s}\nsink: {batch_max_wait: %s}\n", window, wait)
		httpAddr := freeAddr(b)
		if err := os.WriteFile(cfgFile, []byte(benchConfig(kafka.ListenAddrs(), dsn, "debezium-json", "", httpAddr, extra)), 0o600); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(binary(b), "run", "--config", cfgFile)
		cmd.Stderr = os.Stderr
		if prof := os.Getenv("LATENCY_CPUPROFILE"); prof != "" { // where the binary's CPU of a trickle goes
			cmd.Env = append(os.Environ(), "SCD2SINK_CPUPROFILE="+prof)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.ProducerLinger(0),
			kgo.ProducerBatchCompression(kgo.NoCompression()))
		if err != nil {
			b.Fatal(err)
		}
		// Warm up: the group is joined and the tables exist once the
		// first records are applied.
		vis := newVisibility(b, cfgFile)
		produce := func(w scdtest.BenchRecord, track bool) {
			k, v := w.Src.Envelope(w.Change)
			if w.Tombstone {
				v = nil
			}
			vis.sent(b, w, k, v, time.Now(), track)
			cl.Produce(ctx, &kgo.Record{Topic: w.Src.Topic(), Key: k, Value: v}, func(r *kgo.Record, err error) {
				if err != nil {
					b.Error(err)
				}
			})
		}
		warm := 0
		for ; warm < 200; warm++ {
			produce(work[warm], false)
		}
		waitApplied(b, pool, 200, time.Minute)
		b.StartTimer()
		var lat []time.Duration
		var finished atomic.Bool
		done := make(chan struct{})
		go func() { // the observer: a reader of the history polling every 20 ms
			defer close(done)
			deadline := time.Now().Add(time.Duration(seconds)*time.Second + 30*time.Second)
			poll := time.NewTicker(20 * time.Millisecond)
			defer poll.Stop()
			for time.Now().Before(deadline) {
				<-poll.C
				lat = append(lat, vis.poll(ctx, pool)...)
				if finished.Load() && vis.outstanding() == 0 {
					return
				}
			}
		}()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		for _, w := range work[warm:] {
			<-tick.C
			produce(w, true)
		}
		tick.Stop()
		if err := cl.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		finished.Store(true)
		<-done
		if n := vis.outstanding(); n > 0 {
			b.Errorf("%d followed events never became visible", n)
		}
		b.StopTimer()
		m := scrape(b, "http://"+httpAddr+"/metrics", "scd2sink_batch_apply_seconds_sum", "scd2sink_batch_apply_seconds_count")
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("scd2sink: %v", err)
		}
		cl.Close()
		pool.Close()
		kafka.Close()
		if len(lat) == 0 {
			b.Fatal("no latencies measured")
		}
		slices.Sort(lat)
		pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
		b.ReportMetric(float64(pct(0.50).Milliseconds()), "p50_ms")
		b.ReportMetric(float64(pct(0.99).Milliseconds()), "p99_ms")
		b.ReportMetric(float64(lat[len(lat)-1].Milliseconds()), "max_ms")
		b.ReportMetric(float64((pct(0.99) - window).Milliseconds()), "p99_over_window_ms")
		// The binary's CPU over the whole run (warm-up included) per event
		// produced: what a steady trickle costs against a backlog's figure.
		cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		b.ReportMetric(float64(cpu.Microseconds())/float64(len(work)), "cpu_us/event")
		batches := m["scd2sink_batch_apply_seconds_count"]
		b.ReportMetric(batches, "batches")
		b.Logf("%.0f batches applied in %.1f ms on average", batches, 1000*m["scd2sink_batch_apply_seconds_sum"]/max(batches, 1))
		b.Logf("%d events at %d/s (reorder_window %s, batch_max_wait %s): produce-to-visible p50 %s, p99 %s (window + %s), max %s; the binary's CPU %s (%.0f µs per event)",
			len(lat), rate, window, wait, pct(0.5).Round(time.Millisecond), pct(0.99).Round(time.Millisecond),
			(pct(0.99) - window).Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), cpu.Round(10*time.Millisecond),
			float64(cpu.Microseconds())/float64(len(work)))
	}
}

// waitApplied waits until scd2sink_offsets accounts for n records.
func waitApplied(tb testing.TB, pool *pgxpool.Pool, n int64, within time.Duration) {
	tb.Helper()
	end := time.Now().Add(within)
	for time.Now().Before(end) {
		var applied int64
		_ = pool.QueryRow(context.Background(), `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets`).Scan(&applied)
		if applied >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Fatalf("fewer than %d records applied within %s", n, within)
}

// envInt reads a benchmark's knob from the environment.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
