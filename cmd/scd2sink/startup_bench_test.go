package main

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkStartup measures the fixed cost of a start (issue 32, item 3):
// with the tables created and PostgreSQL warm from a first run, `scd2sink
// run` is started again, restarts times, each with 50 new changes waiting
// in Kafka, and timed from exec until their offsets are committed in
// PostgreSQL (polled every 2 ms). The reorder window is 100 ms; what is
// reported is the median and the worst time less that window:
// connecting, preparing the tables, joining the group, fetching, applying.
func BenchmarkStartup(b *testing.B) {
	const restarts, perStart, window = 7, 50, 100 * time.Millisecond
	work := scdtest.BenchWorkload(rand.New(rand.NewPCG(7, 8)), 1000, 2000+restarts*perStart)
	recs, _ := benchRecords(b, work, "debezium-json")
	ctx := context.Background()
	b.StopTimer()
	for iter := 0; iter < b.N; iter++ {
		kafka := benchKafka(b, recs[:2000], kgo.NoCompression())
		cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
		if err != nil {
			b.Fatal(err)
		}
		dsn := pgtest.NewDatabase(b)
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		cfgFile := filepath.Join(b.TempDir(), "scd2sink.yaml")
		if err := os.WriteFile(cfgFile, []byte(benchConfig(kafka.ListenAddrs(), dsn, "debezium-json", "", freeAddr(b),
			"sequencer: {reorder_window: 100ms}\n")), 0o600); err != nil {
			b.Fatal(err)
		}
		runUntil := func(n int64) time.Duration {
			cmd := exec.Command(binary(b), "run", "--config", cfgFile)
			cmd.Stderr = os.Stderr
			start := time.Now()
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			for applied := int64(0); applied < n; {
				time.Sleep(2 * time.Millisecond)
				_ = pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets`).Scan(&applied)
				if time.Since(start) > 2*time.Minute {
					b.Fatal("not applied within 2 minutes")
				}
			}
			d := time.Since(start)
			_ = cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				b.Fatalf("scd2sink run: %v", err)
			}
			return d
		}
		first := runUntil(2000)
		var times []time.Duration
		for r := range restarts {
			lo := 2000 + r*perStart
			if err := cl.ProduceSync(ctx, recs[lo:lo+perStart]...).FirstErr(); err != nil {
				b.Fatal(err)
			}
			times = append(times, runUntil(int64(lo+perStart))-window)
		}
		cl.Close()
		pool.Close()
		kafka.Close()
		slices.Sort(times)
		median, worst := times[len(times)/2], times[len(times)-1]
		b.ReportMetric(float64(median.Milliseconds()), "startup_median_ms")
		b.ReportMetric(float64(worst.Milliseconds()), "startup_worst_ms")
		b.Logf("first run (2,000 changes, tables created) %s; %d restarts with %d changes waiting, less the 100 ms window: %v",
			first.Round(time.Millisecond), restarts, perStart, times)
	}
}
