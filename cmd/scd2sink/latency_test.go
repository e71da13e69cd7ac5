package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkLatency measures produce-to-visible latency at a steady rate:
// the real binary (reorder_window 200ms, batch_max_wait 250ms, the default) reads an
// in-process Kafka while this benchmark produces real-shaped Debezium JSON
// envelopes (scdtest.BenchWorkload) at 1,000 events/s for 20 s. An event
// is visible when scd2sink_offsets, written in the transaction that applied
// it, has passed its offset (polled every 2 ms). It reports p50, p99 and
// the maximum, and p99 minus the reorder window.
func BenchmarkLatency(b *testing.B) {
	const rate, seconds = 1000, 20
	const window, wait = 200 * time.Millisecond, 250 * time.Millisecond // wait: the default
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
		if err := os.WriteFile(cfgFile, []byte(benchConfig(kafka.ListenAddrs(), dsn, "debezium-json", "", "", extra)), 0o600); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(binary(b), "run", "--config", cfgFile)
		cmd.Stderr = os.Stderr
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
		sent := map[change.Partition]map[int64]time.Time{}
		var mu sync.Mutex
		produce := func(w scdtest.BenchRecord, track bool) {
			k, v := w.Src.Envelope(w.Change)
			if w.Tombstone {
				v = nil
			}
			at := time.Now()
			cl.Produce(ctx, &kgo.Record{Topic: w.Src.Topic(), Key: k, Value: v}, func(r *kgo.Record, err error) {
				if err != nil {
					b.Error(err)
					return
				}
				if !track || w.Tombstone {
					return
				}
				mu.Lock()
				p := change.Partition{Topic: r.Topic, Partition: r.Partition}
				if sent[p] == nil {
					sent[p] = map[int64]time.Time{}
				}
				sent[p][r.Offset] = at
				mu.Unlock()
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
		go func() { // the observer
			defer close(done)
			deadline := time.Now().Add(seconds*time.Second + 30*time.Second)
			for time.Now().Before(deadline) {
				time.Sleep(2 * time.Millisecond)
				rows, err := pool.Query(ctx, `SELECT topic, partition, next_offset FROM scd2sink_offsets`)
				if err != nil {
					continue
				}
				now := time.Now()
				for rows.Next() {
					var p change.Partition
					var next int64
					if err := rows.Scan(&p.Topic, &p.Partition, &next); err != nil {
						continue
					}
					mu.Lock()
					for o, at := range sent[p] {
						if o < next {
							lat = append(lat, now.Sub(at))
							delete(sent[p], o)
						}
					}
					mu.Unlock()
				}
				rows.Close()
				if finished.Load() && allSeen(sent, &mu) {
					return
				}
			}
		}()
		tick := time.NewTicker(time.Second / rate)
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
		b.StopTimer()
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
		b.Logf("%d events at %d/s (reorder_window %s, batch_max_wait %s): produce-to-visible p50 %s, p99 %s (window + %s), max %s",
			len(lat), rate, window, wait, pct(0.5).Round(time.Millisecond), pct(0.99).Round(time.Millisecond),
			(pct(0.99) - window).Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	}
}

func allSeen(sent map[change.Partition]map[int64]time.Time, mu *sync.Mutex) bool {
	mu.Lock()
	defer mu.Unlock()
	for _, m := range sent {
		if len(m) > 0 {
			return false
		}
	}
	return true
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
