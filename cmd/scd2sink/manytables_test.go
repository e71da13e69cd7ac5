package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
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
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkManyTables runs the real binary over the same Debezium JSON
// changes written once into 2 topics and once into 200 (four partitions
// each, as Debezium topics often have; BENCH_PARTITIONS overrides), read
// through one topic_pattern entry. First run: 24,000 changes
// into an empty database (every history table created on its first
// event). Restart: the binary stopped, 48,000 more changes produced, the
// binary started again over the existing tables. It reports events/s of
// both runs, the restart's time to ready and the DDL it ran (an event
// trigger counts it), the peak RSS and the most private memory of one of
// its PostgreSQL backends (prepared statements and caches; a local server
// only); the 200-table case reports its ratios to the 2-table case of the
// same run. BENCH_DSN_EXTRA is appended to the DSN
// ("&statement_cache_capacity=512"), BENCH_CONFIG to the
// configuration file ("sequencer: {quiet_after: 0s}\n"); BENCH_MANY_SCALE
// multiplies the keys and changes (fixed costs, such as a table's first
// statements, weigh less in a longer run).
func BenchmarkManyTables(b *testing.B) {
	scale := 1
	if n, err := strconv.Atoi(os.Getenv("BENCH_MANY_SCALE")); err == nil && n > 0 {
		scale = n
	}
	work := scdtest.BenchWorkload(rand.New(rand.NewPCG(3, 4)), scale*12_000, scale*72_000)
	split := 0
	for n := 0; split < len(work) && n < scale*24_000; split++ {
		if !work[split].Tombstone {
			n++
		}
	}
	var base manyResult
	for _, tables := range []int{2, 200} {
		b.Run(fmt.Sprintf("tables=%d", tables), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r := manyTables(b, work, split, tables)
				b.ReportMetric(r.first, "first_events/s")
				b.ReportMetric(r.restart, "restart_events/s")
				b.ReportMetric(r.ready.Seconds(), "restart_ready_s")
				b.ReportMetric(float64(r.ddl), "restart_ddl")
				b.ReportMetric(r.rssMiB, "peak_rss_MiB")
				b.ReportMetric(r.backendMiB, "pg_backend_anon_MiB")
				b.Logf("%d tables: first run (creating the tables) %.0f events/s; restart over existing tables %.0f events/s, ready after %v with %d DDL statements; peak RSS %.0f MiB",
					tables, r.first, r.restart, r.ready.Round(time.Millisecond), r.ddl, r.rssMiB)
				if tables == 2 {
					base = r
				} else if base.first > 0 {
					b.ReportMetric(r.first/base.first, "first_ratio")
					b.ReportMetric(r.restart/base.restart, "restart_ratio")
					extra := r.firstTook - base.firstTook
					b.ReportMetric(extra.Seconds(), "creating_tables_s")
					b.Logf("ratio to 2 tables: first run %.2f, restart %.2f; the first run took %v longer: creating %d more tables",
						r.first/base.first, r.restart/base.restart, extra.Round(time.Millisecond), tables-2)
				}
			}
		})
	}
}

type manyResult struct {
	first, restart float64
	firstTook      time.Duration
	ready          time.Duration
	ddl            int
	rssMiB         float64
	backendMiB     float64
}

func manyTables(b *testing.B, work []scdtest.BenchRecord, split, tables int) manyResult {
	b.Helper()
	ctx := context.Background()
	// Each key's changes go to one of tables/2 copies of its table.
	srcs := map[string]*scdtest.Source{}
	topicOf := func(w scdtest.BenchRecord) *scdtest.Source {
		id := w.Change.After["id"]
		if id == nil {
			id = w.Change.Before["id"]
		}
		k, _ := id.(int)
		name := fmt.Sprintf("%s%03d", w.Src.Table, k%(tables/2))
		if s := srcs[name]; s != nil {
			return s
		}
		s := *w.Src
		s.Table = name
		srcs[name] = &s
		return &s
	}
	recs := make([]*kgo.Record, len(work))
	var topics []string
	for i, w := range work {
		src := topicOf(w)
		k, v := src.Envelope(w.Change)
		if w.Tombstone {
			v = nil
		}
		recs[i] = &kgo.Record{Topic: src.Topic(), Key: k, Value: v}
	}
	for _, s := range srcs {
		topics = append(topics, s.Topic())
	}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(benchPartitions(), topics...))
	if err != nil {
		b.Fatal(err)
	}
	defer kafka.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	produce := func(rs []*kgo.Record) {
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	dsn := pgtest.NewDatabase(b) + os.Getenv("BENCH_DSN_EXTRA") // "&statement_cache_capacity=512"
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE ddl_log (tag text, at timestamptz DEFAULT clock_timestamp());
		CREATE FUNCTION log_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO ddl_log (tag) VALUES (tg_tag); END $$;
		CREATE EVENT TRIGGER log_ddl ON ddl_command_start EXECUTE FUNCTION log_ddl()`); err != nil {
		b.Fatal(err)
	}
	httpAddr := freeAddr(b)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfgFile := filepath.Join(b.TempDir(), "scd2sink.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf(`kafka: {brokers: %s, group_id: bench}
postgres: {dsn: %q}
http: {addr: %q}
log: {level: %s}
tables:
  - topic_pattern: 'bench\.public\..*'
    target: "{table}_history"
    keys: [id]
%s`, brokers, dsn, httpAddr, benchLogLevel(), os.Getenv("BENCH_CONFIG"))), 0o600); err != nil {
		b.Fatal(err)
	}
	applied := func(want int64, start time.Time) time.Duration {
		for {
			var n int64
			_ = pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets`).Scan(&n)
			if n >= want {
				return time.Since(start)
			}
			if time.Since(start) > 10*time.Minute {
				b.Fatalf("%d of %d records applied after 10 minutes", n, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	var backendMiB float64 // the most private memory of one of the binary's PostgreSQL backends
	run := func(want int64) (took, ready time.Duration, rss float64) {
		cmd := exec.Command(binary(b), "run", "--config", cfgFile)
		cmd.Stderr = os.Stderr
		b.StartTimer()
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		hwm := watchHWM(cmd.Process.Pid)
		for ready == 0 && time.Since(start) < time.Minute {
			if resp, err := http.Get("http://" + httpAddr + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ready = time.Since(start)
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		took = applied(want, start)
		b.StopTimer()
		backendMiB = max(backendMiB, backendsAnon(b, pool))
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("scd2sink: %v", err)
		}
		return took, ready, float64(<-hwm) / 1024
	}
	events := func(rs []scdtest.BenchRecord) float64 {
		n := 0
		for _, w := range rs {
			if !w.Tombstone {
				n++
			}
		}
		return float64(n)
	}
	b.StopTimer()
	produce(recs[:split])
	took1, _, rss1 := run(int64(split))
	var r manyResult
	r.first = events(work[:split]) / took1.Seconds()
	var created int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename LIKE '%\_history'`).Scan(&created)
	if created != tables {
		b.Fatalf("%d history tables, want %d", created, tables)
	}
	if _, err := pool.Exec(ctx, `TRUNCATE ddl_log`); err != nil {
		b.Fatal(err)
	}
	statements := os.Getenv("BENCH_STATEMENTS") != ""
	if statements {
		if _, err := pool.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
			b.Fatalf("BENCH_STATEMENTS needs pg_stat_statements: %v", err)
		}
	}
	end := len(recs)
	if os.Getenv("BENCH_RESTART_SAME") != "" {
		end = 2 * split // as many changes as the first run
	}
	produce(recs[split:end])
	took2, ready, rss2 := run(int64(end))
	if statements {
		scdtest.LogStatements(b, pool, 15)
	}
	r.restart = events(work[split:end]) / took2.Seconds()
	r.ready, r.rssMiB = ready, max(rss2, rss1)
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM ddl_log`).Scan(&r.ddl)
	r.firstTook = took1
	r.backendMiB = backendMiB
	return r
}

// backendsAnon is the most anonymous (private) memory of one of the
// binary's PostgreSQL backends, in MiB, read from /proc (0 when the
// server runs elsewhere): its prepared statements, caches and work
// memory, not shared buffers.
func backendsAnon(b *testing.B, pool *pgxpool.Pool) float64 {
	b.Helper()
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = 'scd2sink' AND datname = current_database()`)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatal(err)
	}
	most := 0.0
	for _, pid := range pids {
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue // a server elsewhere (a container's pids are not ours)
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(st), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "Anonymous:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				most = max(most, kb/1024)
			}
		}
	}
	return most
}

// benchPartitions is the partitions per topic of BenchmarkManyTables: 4,
// or BENCH_PARTITIONS.
func benchPartitions() int32 {
	if n, err := strconv.Atoi(os.Getenv("BENCH_PARTITIONS")); err == nil && n > 0 {
		return int32(n)
	}
	return 4
}

// benchLogLevel is the log level of the binary under a benchmark: warn, or
// BENCH_LOG (debug shows each batch applied).
func benchLogLevel() string {
	if l := os.Getenv("BENCH_LOG"); l != "" {
		return l
	}
	return "warn"
}
