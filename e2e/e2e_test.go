//go:build e2e

// Package e2e runs scd2sink against the real stack: a source PostgreSQL
// changed by a workload, Debezium's PostgreSQL connector in Kafka Connect,
// an Apache Kafka broker, and a target PostgreSQL, all started here from
// Maven Central's jars and the local PostgreSQL binaries (no Docker). The
// expected history comes from the source itself (an audit trigger), not
// from Debezium. Run it with `make e2e`.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
)

var (
	cache  string // the jars (e2e/fetch.sh)
	binary string // scd2sink, built for the run
)

func TestMain(m *testing.M) {
	start := time.Now()
	out, err := exec.Command("bash", "fetch.sh").Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: fetching jars: %v\n", err)
		os.Exit(1)
	}
	cache = strings.TrimSpace(string(out))
	bin, err := os.MkdirTemp("", "scd2sink-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(bin, "scd2sink")
	if out, err := exec.Command("go", "build", "-o", binary, "../cmd/scd2sink").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building scd2sink: %v\n%s", err, out)
		os.Exit(1)
	}
	code := pgtest.Main(m)
	os.RemoveAll(bin)
	fmt.Fprintf(os.Stderr, "e2e: wall time %v\n", time.Since(start).Round(time.Second))
	os.Exit(code)
}

// runSink starts scd2sink run with a config for the stack.
func runSink(t *testing.T, dir, name, bootstrap, targetDSN string) *proc {
	t.Helper()
	brokers, _ := json.Marshal([]string{bootstrap})
	cfg := filepath.Join(dir, name+".yaml")
	yaml := fmt.Sprintf(`kafka:
  brokers: %s
  session_timeout: 6s
postgres:
  dsn: %q
http:
  addr: "127.0.0.1:%d"
sequencer:
  reorder_window: 200ms
sink:
  batch_max_wait: 100ms
shutdown_timeout: 20s
tables:
  - topic: shop.public.customers
    target: customers_history
    track_history: [plan, city, balance]
`, brokers, targetDSN, freePort(t))
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return startProc(t, dir, name, []string{binary, "run", "--config", cfg})
}

// TestHistoryMatchesSource: a workload on the source while scd2sink runs;
// the history table then equals the fold of the source's own audit log,
// and scd2sink verify passes.
func TestHistoryMatchesSource(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	writeLog4j(t, cache)
	src := startSource(t, ctx)
	target, err := pgtest.StartLocal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(target.Stop)
	targetDSN, err := target.CreateDatabase(ctx, "warehouse")
	if err != nil {
		t.Fatal(err)
	}
	kafka := startBroker(t, cache, dir)
	conn := startConnect(t, cache, dir, kafka.addr(), src, "public.customers")
	// Debezium streams once its slot is active.
	if err := waitFor(ctx, 90*time.Second, func() (bool, error) {
		var active bool
		err := src.pool.QueryRow(ctx, `SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = 'scd2sink_e2e'`).Scan(&active)
		return active, err
	}); err != nil {
		t.Fatalf("Debezium never started streaming: %v\n%s", err, conn.proc.tail(40))
	}
	sinkProc := runSink(t, dir, "scd2sink", kafka.addr(), targetDSN)

	w := newWorkload(1)
	if err := w.run(ctx, src.pool, 300, 400); err != nil {
		t.Fatal(err)
	}
	want := truth(t, ctx, src)
	tpool := utcPool(t, targetDSN)
	var got []string
	err = waitFor(ctx, 120*time.Second, func() (bool, error) {
		var exists bool
		if err := tpool.QueryRow(ctx, `SELECT to_regclass('public.customers_history') IS NOT NULL`).Scan(&exists); err != nil || !exists {
			return false, err
		}
		got = stripSeq(scdtest.HistoryLines(t, tpool, historySpec, historyCols))
		return scdtest.DiffLines(want, got) == "", nil
	})
	if err != nil {
		t.Fatalf("history never matched the source (%d expected, %d got versions): %v\n%s\nscd2sink:\n%s\nconnect:\n%s",
			len(want), len(got), err, scdtest.DiffLines(want, got), sinkProc.tail(20), conn.proc.tail(20))
	}
	t.Logf("history equals the source's audit log: %d versions", len(want))
	sinkProc.stop(30 * time.Second)
	cfg := filepath.Join(dir, "scd2sink.yaml")
	if out, err := exec.Command(binary, "verify", "--config", cfg).CombinedOutput(); err != nil {
		t.Fatalf("scd2sink verify: %v\n%s", err, out)
	}
}
