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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
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
	if err := trackHistoryFromDeploy(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		os.Exit(1)
	}
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

// trackHistoryFromDeploy gives the model the track_history that scd2sink
// runs with (deploy/scd2sink.yaml).
func trackHistoryFromDeploy() error {
	raw, err := os.ReadFile("../deploy/scd2sink.yaml")
	if err != nil {
		return err
	}
	cfg, err := config.Parse(raw, func(string) (string, bool) { return "", false })
	if err != nil {
		return fmt.Errorf("deploy/scd2sink.yaml: %w", err)
	}
	for i := range tables {
		found := false
		for _, tb := range cfg.Tables {
			if tb.Target == tables[i].spec.Target {
				tables[i].spec.TrackHistory, found = tb.TrackHistory, true
			}
		}
		if !found {
			return fmt.Errorf("deploy/scd2sink.yaml has no table %s", tables[i].spec.Target)
		}
	}
	return nil
}

// runSink starts scd2sink run with a config for the stack: its tables are
// those of docker-compose.yml's scd2sink (deploy/scd2sink.yaml).
func runSink(t *testing.T, dir, name, bootstrap, targetDSN string, env ...string) *proc {
	t.Helper()
	return runSinkWith(t, dir, name, bootstrap, targetDSN, "", env...)
}

// runSinkWith is runSink with more top-level configuration (extra).
func runSinkWith(t *testing.T, dir, name, bootstrap, targetDSN, extra string, env ...string) *proc {
	t.Helper()
	deployed, err := os.ReadFile("../deploy/scd2sink.yaml")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(deployed), "\ntables:")
	if i < 0 {
		t.Fatal("deploy/scd2sink.yaml has no tables section")
	}
	return runSinkTables(t, dir, name, bootstrap, targetDSN, extra+string(deployed[i+1:]), env...)
}

// runSinkTables is runSink with the given configuration after the stack's
// (a tables section, and anything before it).
func runSinkTables(t *testing.T, dir, name, bootstrap, targetDSN, rest string, env ...string) *proc {
	t.Helper()
	return runSinkKafka(t, dir, name, bootstrap, targetDSN, "", rest, env...)
}

// runSinkKafka is runSinkTables with more keys in the kafka section:
// lines indented by two spaces, each ending in a newline, such as
// "  group_id: g\n  start_offset: latest\n".
func runSinkKafka(t *testing.T, dir, name, bootstrap, targetDSN, kafka, rest string, env ...string) *proc {
	t.Helper()
	brokers, _ := json.Marshal([]string{bootstrap})
	cfg := filepath.Join(dir, name+".yaml")
	yaml := fmt.Sprintf(`kafka:
  brokers: %s
  session_timeout: 10s
  metadata_max_age: 2s
%spostgres:
  dsn: %q
http:
  addr: "127.0.0.1:%d"
sequencer:
  reorder_window: 200ms
sink:
  batch_max_wait: 100ms
shutdown_timeout: 3s
`, brokers, kafka, targetDSN, freePort(t)) + rest
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return startProc(t, dir, name, []string{binary, "run", "--config", cfg}, env...)
}

// stack is the real pipeline of one test.
type stack struct {
	dir       string
	src       sourceDB
	target    *pgtest.Cluster
	targetDSN string
	kafka     *broker
	conn      *connect
	tpool     *pgxpool.Pool
}

// newStack starts the pipeline; partitions > 1 creates the customers topic
// with that many partitions before Debezium writes to it.
func newStack(t *testing.T, ctx context.Context, partitions int32) *stack {
	t.Helper()
	if composeTarget() {
		return composeStack(t, ctx)
	}
	return newStackWith(t, ctx, stackOpts{partitions: partitions})
}

// stackOpts vary the stack: the customers topic's partitions, Connect's
// converter properties and what the connector captures (see
// startConnect), and a function run once the broker is up.
type stackOpts struct {
	partitions int32
	converters string
	capture    string // table.include.list; default the sample's two tables
	connector  string // more connector properties (they win)
	before     func(st *stack)
}

// newStackWith is newStack with options.
func newStackWith(t *testing.T, ctx context.Context, o stackOpts) *stack {
	t.Helper()
	partitions, before := o.partitions, o.before
	st := &stack{dir: t.TempDir()}
	writeLog4j(t, cache)
	st.src = startSource(t, ctx)
	var err error
	if st.target, err = pgtest.StartLocal(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.target.Stop)
	if st.targetDSN, err = st.target.CreateDatabase(ctx, "warehouse"); err != nil {
		t.Fatal(err)
	}
	st.tpool = utcPool(t, st.targetDSN)
	st.kafka = startBroker(t, cache, st.dir)
	if partitions > 1 {
		cl, err := kgo.NewClient(kgo.SeedBrokers(st.kafka.addr()))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, nil, "shop.public.customers")
		cl.Close()
		if err != nil || resp.Err != nil {
			t.Fatalf("creating the topic: %v %v", err, resp.Err)
		}
	}
	if before != nil {
		before(st)
	}
	if o.capture == "" {
		o.capture = "public.customers,public.accounts"
	}
	st.conn = startConnect(t, cache, st.dir, st.kafka.addr(), st.src, o.capture, o.converters, o.connector)
	// Debezium streams once its slot is active.
	if err := waitFor(ctx, 90*time.Second, func() (bool, error) {
		var active bool
		err := st.src.pool.QueryRow(ctx, `SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = 'scd2sink_e2e'`).Scan(&active)
		return active, err
	}); err != nil {
		t.Fatalf("Debezium never started streaming: %v\n%s", err, st.conn.proc.tail(40))
	}
	return st
}

// converge waits until every history table equals the source's audit log;
// it returns the number of versions.
func (st *stack) converge(t *testing.T, ctx context.Context, within time.Duration, logs ...*proc) int {
	t.Helper()
	total := 0
	for _, tb := range tables {
		want := truth(t, ctx, st.src, tb)
		var got []string
		err := waitFor(ctx, within, func() (bool, error) {
			var exists bool
			if err := st.tpool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, "public."+tb.spec.Target).Scan(&exists); err != nil || !exists {
				return false, err
			}
			got = ownLines(stripSeq(scdtest.HistoryLines(t, st.tpool, tb.spec, tb.cols)))
			return scdtest.DiffLines(want, got) == "", nil
		})
		if err != nil {
			var tails []string
			for _, p := range logs {
				tails = append(tails, p.name+":\n"+p.tail(20))
			}
			t.Fatalf("%s never matched the source (%d expected, %d got versions): %v\n%s\n%s",
				tb.spec.Target, len(want), len(got), err, scdtest.DiffLines(want, got), strings.Join(tails, "\n"))
		}
		total += len(want)
	}
	return total
}

// histories reads every history table, without sequences.
func (st *stack) histories(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, tb := range tables {
		out = append(out, ownLines(stripSeq(scdtest.HistoryLines(t, st.tpool, tb.spec, tb.cols)))...)
	}
	return out
}

// TestHistoryMatchesSource: a workload on the source while scd2sink runs;
// the history table then equals the fold of the source's own audit log,
// and scd2sink verify passes.
//
// Connect's producers compress with lz4 here, as production connectors
// often do: scd2sink's fetch size follows the compression, and the records
// decompress into pooled buffers recycled once decoded (consumer/pool.go).
func TestHistoryMatchesSource(t *testing.T) {
	ctx := context.Background()
	var st *stack
	if composeTarget() {
		st = composeStack(t, ctx)
	} else {
		st = newStackWith(t, ctx, stackOpts{partitions: 1, connector: "producer.override.compression.type=lz4\n"})
	}
	if composeTarget() {
		if err := newWorkload(1).run(ctx, st.src.pool, 300, 400); err != nil {
			t.Fatal(err)
		}
		t.Logf("compose stack: history equals the source's audit log: %d versions", st.converge(t, ctx, 180*time.Second))
		return
	}
	sinkProc := runSink(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN)
	w := newWorkload(1)
	if err := w.run(ctx, st.src.pool, 300, 400); err != nil {
		t.Fatal(err)
	}
	n := st.converge(t, ctx, 120*time.Second, sinkProc, st.conn.proc)
	t.Logf("history equals the source's audit log: %d versions", n)
	if codecs := batchCodecs(t, ctx, st.kafka.addr(), "shop.public.customers"); codecs[3] == 0 || len(codecs) != 1 {
		t.Fatalf("the topic's record batches by codec: %v; want lz4 (3) only", codecs)
	}
	checkKeyChanges(t, ctx, st, w, 4)
	n = st.converge(t, ctx, 30*time.Second, sinkProc, st.conn.proc)
	t.Logf("after the primary-key changes: history equals the source's audit log: %d versions", n)
	sinkProc.stop(30 * time.Second)
	cfg := filepath.Join(st.dir, "scd2sink.yaml")
	if out, err := exec.Command(binary, "verify", "--config", cfg).CombinedOutput(); err != nil {
		t.Fatalf("scd2sink verify: %v\n%s", err, out)
	}
}

// skipOnCompose skips tests that start and kill processes.
func skipOnCompose(t *testing.T) {
	t.Helper()
	if composeTarget() {
		t.Skip("E2E_TARGET=compose: the fault cases need processes this test starts")
	}
}

// composeTarget: E2E_TARGET=compose runs the checks against a running
// `docker compose up` stack instead of starting one.
func composeTarget() bool { return os.Getenv("E2E_TARGET") == "compose" }

// composeStack is the running compose stack (its published ports, or
// E2E_SOURCE_DSN and E2E_TARGET_DSN): the audit trigger is installed on its
// source; the processes are not this test's to start or stop.
func composeStack(t *testing.T, ctx context.Context) *stack {
	t.Helper()
	srcDSN := envOr("E2E_SOURCE_DSN", "postgres://postgres:postgres@127.0.0.1:15432/shop?sslmode=disable")
	st := &stack{targetDSN: envOr("E2E_TARGET_DSN", "postgres://postgres:postgres@127.0.0.1:15433/warehouse?sslmode=disable")}
	st.src = sourceDB{dsn: srcDSN, db: "shop", pool: utcPool(t, srcDSN)}
	st.src.audit(t, ctx)
	st.tpool = utcPool(t, st.targetDSN)
	return st
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// ownLines keeps the history lines of the workload's keys (from firstID).
func ownLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		var id int
		if _, err := fmt.Sscanf(l, "%d", &id); err == nil && id >= firstID {
			out = append(out, l)
		}
	}
	return out
}

// TestFaults: with the workload running, scd2sink is SIGKILLed and
// restarted at once three times, then SIGTERMed while its group join still
// waits for the killed member's session (it must exit within
// shutdown_timeout); the broker is SIGKILLed and restarted; Kafka Connect is
// SIGKILLed and restarted (Debezium sends events again). After each, the
// history equals the source's audit log.
func TestFaults(t *testing.T) {
	skipOnCompose(t)
	ctx := context.Background()
	st := newStack(t, ctx, 1)
	w := newWorkload(2)
	phase := func(name string, bulk, n int, fault func()) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- w.run(ctx, st.src.pool, bulk, n) }()
		fault()
		if err := <-done; err != nil {
			t.Fatalf("%s: workload: %v", name, err)
		}
	}
	sinkProc := runSink(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN)
	phase("scd2sink killed", 100, 300, func() {
		for i := 0; i < 3; i++ {
			time.Sleep(time.Duration(400+300*i) * time.Millisecond)
			sinkProc.kill()
			sinkProc = runSink(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN)
		}
	})
	// Restarted right after a kill, the new member's join waits for the
	// old session (session_timeout 10s); SIGTERM now must not wait for it.
	time.Sleep(300 * time.Millisecond)
	sinkProc.kill()
	sinkProc = runSink(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN)
	time.Sleep(time.Second)
	start := time.Now()
	sinkProc.stop(60 * time.Second)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("SIGTERM while joining: exited after %v, shutdown_timeout is 3s\n%s", took.Round(time.Millisecond), sinkProc.tail(15))
	} else {
		t.Logf("SIGTERM while joining: exited after %v", took.Round(time.Millisecond))
	}
	sinkProc = runSink(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN)
	n := st.converge(t, ctx, 120*time.Second, sinkProc, st.conn.proc)
	t.Logf("after scd2sink was killed three times: history equals the source, %d versions", n)

	phase("broker killed", 50, 200, func() {
		time.Sleep(time.Second)
		st.kafka.proc.kill()
		time.Sleep(time.Second)
		st.kafka.start(t, st.dir, cache)
	})
	n = st.converge(t, ctx, 180*time.Second, sinkProc, st.conn.proc, st.kafka.proc)
	t.Logf("after the broker was killed: history equals the source, %d versions", n)

	phase("connect killed", 50, 200, func() {
		time.Sleep(time.Second)
		st.conn.proc.kill()
		st.conn.start(t, st.dir, cache)
	})
	n = st.converge(t, ctx, 180*time.Second, sinkProc, st.conn.proc)
	t.Logf("after Kafka Connect was killed: history equals the source, %d versions", n)
}

// TestSharedGroupRestartsAndRebuild: two scd2sink instances share the group
// over a 6-partition topic (a primary-key change's old and new keys then
// live in different partitions) while the workload runs; the target
// PostgreSQL is restarted; one instance is stopped. Then scd2sink rebuild
// replays the topic from the start and swaps in a history identical to the
// live one. Every step ends equal to the source.
func TestSharedGroupRestartsAndRebuild(t *testing.T) {
	skipOnCompose(t)
	ctx := context.Background()
	st := newStack(t, ctx, 6)
	w := newWorkload(3)
	a := runSink(t, st.dir, "scd2sink-a", st.kafka.addr(), st.targetDSN)
	b := runSink(t, st.dir, "scd2sink-b", st.kafka.addr(), st.targetDSN)
	done := make(chan error, 1)
	go func() { done <- w.run(ctx, st.src.pool, 200, 400) }()
	time.Sleep(2 * time.Second)
	if err := st.target.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	t.Log("target PostgreSQL restarted")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	n := st.converge(t, ctx, 180*time.Second, a, b, st.conn.proc)
	t.Logf("two instances, target restarted: history equals the source, %d versions", n)

	go func() { done <- w.run(ctx, st.src.pool, 0, 300) }()
	time.Sleep(time.Second)
	b.stop(30 * time.Second)
	t.Log("one instance stopped")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	n = st.converge(t, ctx, 180*time.Second, a, st.conn.proc)
	t.Logf("one instance left: history equals the source, %d versions", n)
	checkKeyChanges(t, ctx, st, w, 6) // six partitions: old and new keys often in different ones
	n = st.converge(t, ctx, 30*time.Second, a, st.conn.proc)
	t.Logf("after the primary-key changes: history equals the source, %d versions", n)
	live := st.histories(t)
	a.stop(30 * time.Second)

	// Wait for the group's members to be gone, then rebuild.
	cfg := filepath.Join(st.dir, "scd2sink-a.yaml")
	var out []byte
	err := waitFor(ctx, 60*time.Second, func() (bool, error) {
		var err error
		out, err = exec.Command(binary, "rebuild", "--config", cfg).CombinedOutput()
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("scd2sink rebuild: %v\n%s", err, out)
	}
	rebuilt := st.histories(t)
	if d := scdtest.DiffLines(live, rebuilt); d != "" {
		t.Fatalf("the rebuilt history differs from the live one:\n%s", d)
	}
	n = st.converge(t, ctx, 10*time.Second)
	t.Logf("rebuild: history identical to the live one and to the source, %d versions", n)
}
