//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPeerBenchmark (E2E_BENCH=1, make e2e-bench): a backlog of at least
// 200,000 Debezium events of customers in Kafka, read into the same target
// PostgreSQL by Debezium's JDBC sink connector (upsert, latest row only) in
// the same Connect worker, then by scd2sink (full history). Reports each
// one's events/s and the ratio, in three alternating pairs.
func TestPeerBenchmark(t *testing.T) {
	if os.Getenv("E2E_BENCH") == "" {
		t.Skip("the peer benchmark runs with E2E_BENCH=1 (make e2e-bench)")
	}
	skipOnCompose(t)
	ctx := context.Background()
	st := newStack(t, ctx, 1)
	const rows, rounds = 50000, 12 // 50,000 inserts + 12 × 12,500 updates
	start := time.Now()
	if _, err := st.src.pool.Exec(ctx, `INSERT INTO customers
		SELECT g, 'Customer ' || g, (ARRAY['basic','pro','team'])[1 + g % 3], (ARRAY['Wien','Linz','Graz','Salzburg'])[1 + g % 4],
			g * 1.25, date '1950-01-01' + g % 20000, timestamptz '2026-01-01' + g * interval '1 second',
			jsonb_build_object('tier', g % 5, 'score', 1.10), gen_random_uuid(), repeat('bio of ' || g || ' ', 30)
		FROM generate_series(1, $1) g`, rows); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < rounds; r++ {
		q := `UPDATE customers SET plan = (ARRAY['basic','pro','team','enterprise'])[1 + (id + $1) % 4], updated_at = updated_at + interval '1 hour' WHERE id % 4 = $2`
		if r%3 == 2 { // an untracked change: Type 1 only
			q = `UPDATE customers SET name = name || '.', updated_at = updated_at + interval '1 hour' WHERE id % 4 = $2 AND $1 >= 0`
		}
		if _, err := st.src.pool.Exec(ctx, q, r, r%4); err != nil {
			t.Fatal(err)
		}
	}
	total := int64(rows + rounds*rows/4)
	cl, err := kgo.NewClient(kgo.SeedBrokers(st.kafka.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	const topic = "shop.public.customers"
	endOffset := func() int64 {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return 0
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	if err := waitFor(ctx, 10*time.Minute, func() (bool, error) { return endOffset() >= total, nil }); err != nil {
		t.Fatalf("Debezium published %d of %d events: %v", endOffset(), total, err)
	}
	end := endOffset()
	t.Logf("backlog: %d events in %s (source changes and Debezium, %v)", end, topic, time.Since(start).Round(time.Second))

	committed := func(group string) int64 {
		offs, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return 0
		}
		var n int64
		offs.Each(func(o kadm.OffsetResponse) {
			if o.Topic == topic {
				n += o.At
			}
		})
		return n
	}
	// Three alternating pairs over the same topic: the machine's speed
	// drifts by a third within an hour, a pair's two runs minutes apart.
	var ratios []float64
	for pair := 1; pair <= 3; pair++ {
		peer, peerCPU, peerRSS := runJDBCSink(t, ctx, st, topic, pair, end, committed)
		ours, ourCPU, ourRSS, versions := runOurs(t, ctx, st, adm, topic, pair, end)
		peerRate, ourRate := float64(end)/peer.Seconds(), float64(end)/ours.Seconds()
		ratios = append(ratios, ourRate/peerRate)
		t.Logf("pair %d: Debezium JDBC sink 3.6.0 (upsert, latest row): %d events in %v = %.0f events/s, %.1f s of Connect's CPU, Connect's RSS %.0f MiB", pair, end, peer.Round(time.Millisecond), peerRate, peerCPU, peerRSS)
		t.Logf("pair %d: scd2sink (SCD2 history, %d versions): %d events in %v = %.0f events/s, %.1f s of CPU, peak RSS %.0f MiB", pair, versions, end, ours.Round(time.Millisecond), ourRate, ourCPU, ourRSS)
		t.Logf("pair %d: ratio scd2sink / JDBC sink: %.2f", pair, ourRate/peerRate)
	}
	mean := 0.0
	for _, r := range ratios {
		mean += r / float64(len(ratios))
	}
	t.Logf("ratios scd2sink / JDBC sink: %.2f, %.2f, %.2f; mean %.2f", ratios[0], ratios[1], ratios[2], mean)
}

// runJDBCSink registers Debezium's JDBC sink as connector jdbc-sink-<pair>
// (its own consumer group and table), waits until it has committed end,
// and removes it. It returns the time from registering, the Connect
// worker's CPU meanwhile and its resident set at the end.
func runJDBCSink(t *testing.T, ctx context.Context, st *stack, topic string, pair int, end int64, committed func(string) int64) (time.Duration, float64, float64) {
	t.Helper()
	name := fmt.Sprintf("jdbc-sink-%d", pair)
	jdbc := fmt.Sprintf(`{"connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector", "tasks.max": "1",
		"topics": %q, "connection.url": "jdbc:postgresql://127.0.0.1:%s/warehouse", "connection.username": "postgres",
		"connection.password": "unused", "insert.mode": "upsert", "primary.key.mode": "record_key", "delete.enabled": "true",
		"schema.evolution": "basic", "batch.size": "2000", "consumer.override.max.poll.records": "2000",
		"collection.name.format": "jdbc_customers_%d"}`, topic, portOf(st.targetDSN), pair)
	took, cpu, rss := timeConnector(t, ctx, st, name, jdbc, func() bool { return committed("connect-"+name) >= end })
	var latest int64
	_ = st.tpool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM jdbc_customers_%d`, pair)).Scan(&latest)
	if latest != 50000 {
		t.Errorf("the JDBC sink wrote %d latest rows, want 50000", latest)
	}
	return took, cpu, rss
}

// runOurs runs scd2sink over the topic into a database of its own
// (warehouse_<pair>, created empty) until scd2sink_offsets reaches end,
// then stops it and forgets its consumer group. It returns the time from
// starting the binary, its CPU, its peak resident set and the versions it
// wrote.
func runOurs(t *testing.T, ctx context.Context, st *stack, adm *kadm.Client, topic string, pair int, end int64) (time.Duration, float64, float64, int64) {
	t.Helper()
	dsn, pool := benchDatabase(t, ctx, st, fmt.Sprintf("warehouse_%d", pair))
	took, cpu, rss := timeSink(t, ctx, st, adm, fmt.Sprintf("scd2sink-%d", pair), dsn, "", pool, topic, end)
	var versions int64
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM customers_history`).Scan(&versions)
	if versions < 50000 {
		t.Errorf("scd2sink wrote %d versions, want at least 50000", versions)
	}
	return took, cpu, rss, versions
}

// timeConnector registers a sink connector in the stack's Connect worker,
// waits until done, and removes it: the time from registering, the
// worker's CPU meanwhile and its resident set at the end (MiB).
func timeConnector(t *testing.T, ctx context.Context, st *stack, name, cfg string, done func() bool) (time.Duration, float64, float64) {
	t.Helper()
	u := fmt.Sprintf("http://127.0.0.1:%d/connectors/%s", st.conn.rest, name)
	req, _ := http.NewRequest(http.MethodPut, u+"/config", bytes.NewBufferString(cfg))
	req.Header.Set("Content-Type", "application/json")
	pid := st.conn.proc.cmd.Process.Pid
	cpu0 := procCPU(pid)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		t.Fatalf("registering %s: %s\n%s", name, resp.Status, st.conn.proc.tail(30))
	}
	if err := waitFor(ctx, 20*time.Minute, func() (bool, error) { return done(), nil }); err != nil {
		t.Fatalf("%s did not finish: %v\n%s", name, err, st.conn.proc.tail(30))
	}
	took, cpu, rss := time.Since(start), procCPU(pid)-cpu0, procRSS(pid)
	del, _ := http.NewRequest(http.MethodDelete, u, nil)
	if resp, err := http.DefaultClient.Do(del); err == nil {
		resp.Body.Close()
	}
	return took, cpu, rss
}

// benchDatabase creates an empty database in the stack's target and
// returns its DSN and a pool on it (closed with the test).
func benchDatabase(t *testing.T, ctx context.Context, st *stack, db string) (string, *pgxpool.Pool) {
	t.Helper()
	if _, err := st.tpool.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(st.targetDSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return u.String(), pool
}

// timeSink runs scd2sink (the deployed tables, or tables when not empty)
// into dsn until scd2sink_offsets of the topics named like topic (a LIKE
// pattern) reaches end, stops it and forgets its consumer group: the time
// from starting the binary, its CPU and its peak resident set (MiB).
// E2E_BENCH_PROFILE=DIR keeps its CPU profile there.
func timeSink(t *testing.T, ctx context.Context, st *stack, adm *kadm.Client, name, dsn, tables string, pool *pgxpool.Pool, topic string, end int64) (time.Duration, float64, float64) {
	t.Helper()
	var env []string
	if dir := os.Getenv("E2E_BENCH_PROFILE"); dir != "" { // where the binary's CPU goes
		env = append(env, "SCD2SINK_CPUPROFILE="+filepath.Join(dir, name+".prof"))
	}
	start := time.Now()
	var p *proc
	if tables == "" {
		p = runSink(t, st.dir, name, st.kafka.addr(), dsn, env...)
	} else {
		p = runSinkTables(t, st.dir, name, st.kafka.addr(), dsn, tables, env...)
	}
	hwm := make(chan float64, 1)
	go func() { // the peak resident set, read while it runs
		var peak float64
		for !p.exited() {
			peak = max(peak, procHWM(p.cmd.Process.Pid))
			time.Sleep(200 * time.Millisecond)
		}
		hwm <- peak
	}()
	if err := waitFor(ctx, 20*time.Minute, func() (bool, error) {
		var n int64
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE topic LIKE $1`, topic).Scan(&n)
		return n >= end, err
	}); err != nil {
		t.Fatalf("scd2sink did not catch up: %v\n%s", err, p.tail(20))
	}
	took := time.Since(start)
	p.stop(30 * time.Second)
	var cpu float64
	if ps := p.cmd.ProcessState; ps != nil {
		cpu = (ps.UserTime() + ps.SystemTime()).Seconds()
	}
	if _, err := adm.DeleteGroup(ctx, "scd2sink"); err != nil {
		t.Logf("forgetting scd2sink's consumer group: %v", err)
	}
	return took, cpu, <-hwm
}

// procCPU is a process's CPU so far, in seconds (user and system, from
// /proc; 0 if unknown).
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (ut + stime) / 100 // USER_HZ
}

func portOf(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return ""
	}
	return u.Port()
}
