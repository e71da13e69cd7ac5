package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// BenchmarkPipeline runs the real binary over a backlog already in an
// in-process Kafka (scdtest.BenchWorkload: 250,000 changes of two tables
// over 50,000 keys in 6 partitions each: a snapshot, tracked and
// Type-1-only updates, deletes with their tombstones, re-creates; one
// table with REPLICA IDENTITY FULL before images), until every offset is
// applied; then COPYs the resulting history rows into tables of the same
// shape and indexes (the best of three). It reports events/s (changes, from the first applied
// batch to the last), the COPY rows/s and their ratio, the binary's peak
// RSS, its allocations per event and its CPU per event in each stage
// (from a CPU profile of the whole run). Three shapes of the same changes:
//   - debezium-json: what Debezium 3.6's PostgreSQL connector writes with
//     JsonConverter, schemas on (about 4 KB: schema, full source block);
//   - debezium-avro: Confluent Avro with a Schema Registry (srfake);
//   - schemaless: JsonConverter with schemas.enable=false.
//
// The records are produced uncompressed, as a Kafka producer's default
// compression.type=none writes them.
func BenchmarkPipeline(b *testing.B) {
	const nKeys, nEvents = 50_000, 250_000
	work := scdtest.BenchWorkload(rand.New(rand.NewPCG(1, 2)), nKeys, nEvents)
	for _, bc := range []struct {
		name, format string
		codec        kgo.CompressionCodec
	}{
		{"debezium-json", "debezium-json", kgo.NoCompression()},
		{"debezium-avro", "debezium-avro", kgo.NoCompression()},
		{"schemaless", "schemaless", kgo.NoCompression()},
		// JSON with schemas, as most connectors write it, compressed as
		// producers usually are: the schema repeats in every record, so
		// batches decompress about 20 times (consumer/fetchsize.go).
		{"debezium-json-lz4", "debezium-json", kgo.Lz4Compression()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			recs, registry := benchRecords(b, work, bc.format)
			b.Logf("%d records (%d changes), %d bytes each on average", len(recs), nEvents, avgSize(recs))
			benchPipeline(b, recs, work, nEvents, bc.format, registry, bc.codec)
		})
	}
}

// benchRecords renders the workload in a format; for Avro it seeds a
// schema registry and returns its URL.
func benchRecords(b *testing.B, work []scdtest.BenchRecord, format string) ([]*kgo.Record, string) {
	b.Helper()
	ids := map[string]int{}
	var url string
	if format == "debezium-avro" {
		reg := srfake.New()
		b.Cleanup(reg.Close)
		url = reg.URL()
		for i, src := range []*scdtest.Source{scdtest.BenchCustomers(), scdtest.BenchAccounts()} {
			ids[src.Table] = 10 + 2*i
			reg.SeedSchema(src.Topic()+"-value", 1, 10+2*i, sr.Schema{Schema: src.AvroValueSchema(), Type: sr.TypeAvro})
			reg.SeedSchema(src.Topic()+"-key", 1, 11+2*i, sr.Schema{Schema: src.AvroKeySchema(), Type: sr.TypeAvro})
		}
	}
	recs := make([]*kgo.Record, len(work))
	marks := benchMarks(work)
	for i, w := range work {
		var k, v []byte
		w.Change.Txn = marks[i]
		switch format {
		case "debezium-json":
			k, v = w.Src.Envelope(w.Change)
		case "debezium-avro":
			k, v = w.Src.AvroEnvelope(w.Change, ids[w.Src.Table], ids[w.Src.Table]+1)
		default:
			k, v = w.Src.Schemaless(w.Change)
		}
		if w.Tombstone {
			v = nil
		}
		recs[i] = &kgo.Record{Topic: w.Src.Topic(), Key: k, Value: v}
	}
	return recs, url
}

// benchTxnTopic is the transaction topic of BENCH_CONFIG='defaults:
// {transaction_topic: bench.transaction}': the workload's changes carry
// transaction blocks and its transactions END records (benchEnds), what
// exact completeness costs (docs/benchmarks.md).
const benchTxnTopic = "bench.transaction"

func benchTransactions() bool { return strings.Contains(os.Getenv("BENCH_CONFIG"), benchTxnTopic) }

// benchMarks gives each streamed change of work its transaction block
// (nil without benchTransactions).
func benchMarks(work []scdtest.BenchRecord) []*scdtest.TxnBlock {
	out := make([]*scdtest.TxnBlock, len(work))
	if !benchTransactions() {
		return out
	}
	orders := map[int64]int64{}
	for i, w := range work {
		if w.Tombstone || w.Change.Op == "r" {
			continue
		}
		orders[w.Change.TxID]++
		out[i] = &scdtest.TxnBlock{ID: fmt.Sprintf("%d:%d", w.Change.TxID, w.Change.LSN), TotalOrder: orders[w.Change.TxID],
			DataCollectionOrder: orders[w.Change.TxID]}
	}
	return out
}

// benchEnds are the END records of work's transactions, in commit order.
func benchEnds(work []scdtest.BenchRecord) []*kgo.Record {
	var order []int64
	counts := map[int64]map[string]int64{}
	commits := map[int64]time.Time{}
	for _, w := range work {
		if w.Tombstone || w.Change.Op == "r" {
			continue
		}
		tx := w.Change.TxID
		if counts[tx] == nil {
			counts[tx] = map[string]int64{}
			order = append(order, tx)
		}
		counts[tx]["public."+w.Src.Table]++
		commits[tx] = w.Change.Commit
	}
	out := make([]*kgo.Record, 0, len(order))
	for _, tx := range order {
		k, v := scdtest.TransactionRecord(fmt.Sprintf("%d:%d", tx, 1), commits[tx], counts[tx])
		out = append(out, &kgo.Record{Topic: benchTxnTopic, Key: k, Value: v})
	}
	return out
}

func avgSize(recs []*kgo.Record) int {
	n := 0
	for _, r := range recs {
		n += len(r.Key) + len(r.Value)
	}
	return n / len(recs)
}

// benchConfig is the binary's configuration for the benchmark tables.
func benchConfig(brokers []string, dsn, format, registry, httpAddr string, extra string) string {
	bs, _ := json.Marshal(brokers)
	f := "debezium-json"
	if format == "debezium-avro" {
		f = format
	}
	cfg := fmt.Sprintf("kafka: {brokers: %s, group_id: bench}\npostgres: {dsn: %q}\nhttp: {addr: %q}\nlog: {level: warn}\n%s", bs, dsn, httpAddr, extra)
	if registry != "" {
		cfg += fmt.Sprintf("schema_registry: {url: %q}\n", registry)
	}
	cfg += "tables:\n"
	for _, src := range []*scdtest.Source{scdtest.BenchCustomers(), scdtest.BenchAccounts()} {
		tracked, _ := json.Marshal(scdtest.BenchTracked[src.Table])
		cfg += fmt.Sprintf("  - {topic: %s, target: %s_history, keys: [id], format: %s, track_history: %s}\n", src.Topic(), src.Table, f, tracked)
	}
	return cfg
}

// benchColumns are the columns of a benchmark history table but scd_id.
func benchColumns(src *scdtest.Source) []string {
	var cols []string
	for _, c := range src.Cols {
		cols = append(cols, c.Name)
	}
	return append(cols, "valid_from", "valid_to", "is_current", "scd_seq", "scd_close_seq", "scd_op", "scd_hash", "scd_unavailable", "scd_absent", "scd_raw_t", "scd_attnum")
}

// freeAddr returns a local TCP address nothing listens on.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// benchKafka starts an in-process Kafka holding recs (6 partitions per topic).
func benchKafka(b *testing.B, recs []*kgo.Record, codec kgo.CompressionCodec) *kfake.Cluster {
	b.Helper()
	ctx := context.Background()
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(6, scdtest.BenchCustomers().Topic(), scdtest.BenchAccounts().Topic()))
	if err != nil {
		b.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.ProducerBatchMaxBytes(1<<20),
		kgo.ProducerBatchCompression(codec))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	return kafka
}

func benchPipeline(b *testing.B, recs []*kgo.Record, work []scdtest.BenchRecord, nEvents int64, format, registry string, codec kgo.CompressionCodec) {
	nRecords := int64(len(recs))
	ctx := context.Background()
	for iter := 0; iter < b.N; iter++ {
		kafka := benchKafka(b, recs, codec)
		if benchTransactions() {
			ends := benchEnds(work)
			cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, benchTxnTopic); err != nil {
				b.Fatal(err)
			}
			if err := cl.ProduceSync(ctx, ends...).FirstErr(); err != nil {
				b.Fatal(err)
			}
			cl.Close()
			b.Logf("%d END records on %s", len(ends), benchTxnTopic)
		}
		dsn := pgtest.NewDatabase(b)
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		if strings.Contains(os.Getenv("BENCH_CONFIG"), "no_overlap") {
			// BENCH_CONFIG='defaults: {history_constraint: no_overlap}':
			// what the constraint costs (docs/benchmarks.md).
			if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS btree_gist"); err != nil {
				b.Fatal(err)
			}
		}
		httpAddr := freeAddr(b)
		cfgFile := filepath.Join(b.TempDir(), "scd2sink.yaml")
		if err := os.WriteFile(cfgFile, []byte(benchConfig(kafka.ListenAddrs(), dsn, format, registry, httpAddr, os.Getenv("BENCH_CONFIG")+"\n")), 0o600); err != nil { // BENCH_CONFIG: YAML appended to the binary's config
			b.Fatal(err)
		}
		prof := filepath.Join(b.TempDir(), "cpu.prof")
		cmd := exec.Command(binary(b), "run", "--config", cfgFile)
		cmd.Stderr = os.Stderr
		cmd.Env = append(append(os.Environ(), "SCD2SINK_CPUPROFILE="+prof), strings.Fields(os.Getenv("BENCH_ENV"))...) // BENCH_ENV: the binary's own settings (GOGC=... GOMEMLIMIT=...)
		b.StartTimer()
		start := time.Now()
		selfCPU, pgCPU := processCPU(b), postgresCPU()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		hwm := watchHWM(cmd.Process.Pid)
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var first, at10, at90 time.Time
		var applied int64
		for applied < nRecords {
			time.Sleep(10 * time.Millisecond)
			_ = pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets`).Scan(&applied)
			if applied > 0 && first.IsZero() {
				first = time.Now()
			}
			if applied >= nRecords/10 && at10.IsZero() {
				at10 = time.Now()
			}
			if applied >= nRecords*9/10 && at90.IsZero() {
				at90 = time.Now()
			}
			if time.Since(start) > 10*time.Minute {
				b.Fatal("not applied within 10 minutes")
			}
			select {
			case err := <-exited:
				b.Fatalf("scd2sink exited before it applied everything: %v", err)
			default:
			}
		}
		done := time.Now()
		selfCPU, pgCPU = processCPU(b)-selfCPU, postgresCPU()-pgCPU
		b.StopTimer()
		m := scrape(b, "http://"+httpAddr+"/metrics", "go_memstats_mallocs_total", "go_gc_duration_seconds_count",
			"scd2sink_batch_apply_seconds_sum", "scd2sink_batch_apply_seconds_count", "scd2sink_events_released_early_total", "scd2sink_fetch_max_bytes")
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := <-exited; err != nil {
			b.Fatalf("scd2sink: %v", err)
		}
		// Not rusage's Maxrss: with vfork it counts the test process's own
		// pages from before the exec. VmHWM is the binary's own peak.
		rssMiB := float64(<-hwm) / 1024
		var versions int64
		var copyRows int
		var copyDur time.Duration
		for _, src := range []*scdtest.Source{scdtest.BenchCustomers(), scdtest.BenchAccounts()} {
			var n int64
			_ = pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s_history`, src.Table)).Scan(&n)
			versions += n
			// The best of three COPYs: the yardstick at its fastest.
			var best time.Duration
			for i := range 3 {
				rows, dur := scdtest.CopyBaseline(b, pool, pgx.Identifier{src.Table + "_history"}, pgx.Identifier{fmt.Sprintf("%s_copy%d", src.Table, i)}, benchColumns(src), 10_000)
				if i == 0 || dur < best {
					best = dur
				}
				if i == 0 {
					copyRows += rows
				}
			}
			copyDur += best
		}
		// The least SQL that SCD2 needs for the same events (leastsql_test.go).
		var leastEvents int
		var leastDur time.Duration
		var leastPG time.Duration // PostgreSQL's CPU while the least SQL ran
		for _, src := range []*scdtest.Source{scdtest.BenchCustomers(), scdtest.BenchAccounts()} {
			n, d, cpu := leastSQL(b, pool, src, work)
			leastEvents, leastDur, leastPG = leastEvents+n, leastDur+d, leastPG+cpu
		}
		changes := 0
		for _, r := range work {
			if !r.Tombstone {
				changes++
			}
		}
		if leastEvents != changes {
			b.Fatalf("the least-SQL replay has %d events, the workload %d", leastEvents, changes)
		}
		leastEPS := float64(leastEvents) / leastDur.Seconds()
		steady := done.Sub(first)
		eps := float64(nEvents) / steady.Seconds()
		sustained := float64(nEvents*8/10) / at90.Sub(at10).Seconds()
		rps := float64(copyRows) / copyDur.Seconds()
		b.ReportMetric(eps, "events/s")
		b.ReportMetric(rps, "copy_rows/s")
		b.ReportMetric(eps/rps, "ratio")
		b.ReportMetric(leastEPS, "least_sql_events/s")
		b.ReportMetric(eps/leastEPS, "of_least_sql")
		b.ReportMetric(sustained/rps, "sustained_ratio")
		b.ReportMetric(sustained/leastEPS, "sustained_of_least_sql")
		b.ReportMetric(rssMiB, "peak_rss_MiB")
		b.ReportMetric(m["go_memstats_mallocs_total"]/float64(nEvents), "allocs/event")
		b.ReportMetric(m["go_gc_duration_seconds_count"], "gc_cycles")
		b.Logf("%d changes (%d records) -> %d versions: %s from start (%s from the first applied batch, the last reorder window included): %.0f events/s; "+
			"sustained (10%% to 90%% applied) %.0f events/s; COPY %d rows in %s: %.0f rows/s; ratio %.2f (sustained %.2f); peak RSS %.0f MiB; %.0f allocations per event, %.0f GC cycles",
			nEvents, nRecords, versions, done.Sub(start).Round(time.Millisecond), steady.Round(time.Millisecond), eps,
			sustained, copyRows, copyDur.Round(time.Millisecond), rps, eps/rps, sustained/rps, rssMiB,
			m["go_memstats_mallocs_total"]/float64(nEvents), m["go_gc_duration_seconds_count"])
		b.Logf("the least SQL that SCD2 needs for the same events (batches of 10,000, the fold computed beforehand): %.0f events/s in %s; scd2sink reaches %.2f of it",
			leastEPS, leastDur.Round(time.Millisecond), eps/leastEPS)
		applyBusy := m["scd2sink_batch_apply_seconds_sum"] / steady.Seconds()
		b.ReportMetric(applyBusy, "apply_busy")
		b.Logf("the applier was busy %.0f%% of the time (%.0f transactions, %.1f s); %.0f events released early (buffer over its byte budget); fetches of %.0f KiB at the end",
			100*applyBusy, m["scd2sink_batch_apply_seconds_count"], m["scd2sink_batch_apply_seconds_sum"], m["scd2sink_events_released_early_total"], m["scd2sink_fetch_max_bytes"]/1024)
		// On this machine's two cores the in-process Kafka and PostgreSQL
		// share the CPU with scd2sink; the least SQL runs alone.
		b.ReportMetric(selfCPU.Seconds()/done.Sub(start).Seconds(), "kafka_cores")
		b.Logf("the in-process Kafka (and this benchmark's polling) used %.2f s of CPU while scd2sink ran: %.2f of the %d cores; "+
			"PostgreSQL used %.2f s (%.2f cores), and %.2f s for the least SQL", selfCPU.Seconds(), selfCPU.Seconds()/done.Sub(start).Seconds(),
			runtime.NumCPU(), pgCPU.Seconds(), pgCPU.Seconds()/done.Sub(start).Seconds(), leastPG.Seconds())
		b.ReportMetric(pgCPU.Seconds(), "pg_cpu_s")
		b.ReportMetric(leastPG.Seconds(), "least_sql_pg_cpu_s")
		reportStages(b, prof, nEvents)
		if dst := os.Getenv("BENCH_PROFILE_DIR"); dst != "" {
			if data, err := os.ReadFile(prof); err == nil {
				_ = os.WriteFile(filepath.Join(dst, strings.ReplaceAll(b.Name(), "/", "_")+".prof"), data, 0o644)
			}
		}
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

// processCPU is the CPU time this process has used so far.
func processCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// postgresCPU is the CPU time the machine's postgres processes have used
// so far (Linux: /proc, at 100 ticks a second; 0 elsewhere): each running
// process's own, plus what its exited children used (a postmaster's
// cutime and cstime), so that a backend or autovacuum worker that exits
// between two readings still counts. It counts every cluster on the
// machine; the benchmark's is the only busy one.
func postgresCPU() time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, p := range stats {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || !strings.HasSuffix(s[:i], "(postgres") {
			continue
		}
		f := strings.Fields(s[i+1:]) // f[0] is field 3 (state): utime, stime, cutime and cstime are fields 14 to 17
		if len(f) < 15 {
			continue
		}
		for _, v := range f[11:15] {
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
