package main

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkRebuild measures `scd2sink rebuild` (issue 31, item 5): the
// workload of BenchmarkPipeline (debezium-json, 250,000 changes of two
// tables) is applied by `scd2sink run` first; then, with run stopped,
// rebuild replays both topics from the start into fresh tables and swaps
// them in, and `scd2sink verify` checks the result. It reports rebuild's
// seconds per million versions, its events/s against run's on the same
// backlog, its peak RSS, and verify's time.
func BenchmarkRebuild(b *testing.B) {
	const nKeys, nEvents = 50_000, 250_000
	work := scdtest.BenchWorkload(rand.New(rand.NewPCG(1, 2)), nKeys, nEvents)
	recs, _ := benchRecords(b, work, "debezium-json")
	ctx := context.Background()
	b.StopTimer() // what is reported is measured below
	for iter := 0; iter < b.N; iter++ {
		kafka := benchKafka(b, recs, kgo.NoCompression())
		dsn := pgtest.NewDatabase(b)
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		cfgFile := filepath.Join(b.TempDir(), "scd2sink.yaml")
		if err := os.WriteFile(cfgFile, []byte(benchConfig(kafka.ListenAddrs(), dsn, "debezium-json", "", freeAddr(b), "")), 0o600); err != nil {
			b.Fatal(err)
		}
		// run, until every record is applied.
		cmd := exec.Command(binary(b), "run", "--config", cfgFile)
		cmd.Stderr = os.Stderr
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		for applied := int64(0); applied < int64(len(recs)); {
			time.Sleep(20 * time.Millisecond)
			_ = pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets`).Scan(&applied)
			if time.Since(start) > 10*time.Minute {
				b.Fatal("not applied within 10 minutes")
			}
		}
		runDur := time.Since(start)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("scd2sink run: %v", err)
		}
		// rebuild, from start to exit: replay, swap, offsets moved.
		b.StartTimer()
		cmd = exec.Command(binary(b), "rebuild", "--config", cfgFile)
		cmd.Stderr = os.Stderr
		rstart := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		hwm := watchHWM(cmd.Process.Pid)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("scd2sink rebuild: %v", err)
		}
		rebuildDur := time.Since(rstart)
		b.StopTimer()
		rss := <-hwm
		var versions int64
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM customers_history) + (SELECT count(*) FROM accounts_history)`).Scan(&versions); err != nil {
			b.Fatal(err)
		}
		vstart := time.Now()
		if out, err := exec.Command(binary(b), "verify", "--config", cfgFile).CombinedOutput(); err != nil {
			b.Fatalf("scd2sink verify after the rebuild: %v\n%s", err, out)
		}
		verifyDur := time.Since(vstart)
		perMillion := rebuildDur.Seconds() / (float64(versions) / 1e6)
		b.ReportMetric(perMillion, "s/million_versions")
		b.ReportMetric(float64(nEvents)/rebuildDur.Seconds(), "rebuild_events/s")
		b.ReportMetric(float64(nEvents)/runDur.Seconds(), "run_events/s")
		b.ReportMetric(float64(rss)/1024, "peak_rss_MiB")
		b.ReportMetric(verifyDur.Seconds(), "verify_s")
		b.Logf("%d changes -> %d versions: run %s (%.0f events/s from start); rebuild %s (%.0f events/s, %.1f s per million versions, peak RSS %d MiB); verify %s",
			nEvents, versions, runDur.Round(time.Millisecond), float64(nEvents)/runDur.Seconds(), rebuildDur.Round(time.Millisecond),
			float64(nEvents)/rebuildDur.Seconds(), perMillion, rss/1024, verifyDur.Round(time.Millisecond))
		pool.Close()
		kafka.Close()
	}
}
