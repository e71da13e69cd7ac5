package sink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// sizeVersionsPerKey is how many versions each preloaded key has.
const sizeVersionsPerKey = 10

// BenchmarkSize measures the cost of a history table that already holds
// many versions (issue 31, item 5): for each layout (plain, partitioned by
// month, plain with history_constraint: no_overlap) and each size in BENCH_SIZES (default 1,000,000 and 10,000,000
// versions; 0, the empty table, always runs first), it preloads the table,
// then applies the workload of BenchmarkApply ("mixed": 200,000 events on
// 50,000 keys, 10% Type 1 changes) through a fresh sink, as a restarted
// process would, twice: on new keys spread among the preloaded ones, and
// (when the table has 50,000 keys) on preloaded keys spread over the key
// space (the lower half of it: PostgreSQL's own rates are measured on the
// upper half). It reports:
//   - events/s of each, and their ratio to the empty table's (new keys)
//     or the smallest preloaded table's (existing keys) in the same run;
//   - PostgreSQL's own rates on the same table, in transactions rolled
//     back (pgOwnRates), and their ratios likewise: what the table's size
//     costs PostgreSQL itself;
//   - the table's and its indexes' size;
//   - verify's time and how much this process's Go heap and RSS grew
//     while it ran (verify streams: what it holds does not grow with the
//     table);
//   - _as_of: the mean time of one key's versions at a point in time, and
//     of counting the whole table's versions at that time.
//
// Preloading: a template of 10,000 keys (ids multiples of 4) × 10 versions is
// applied through the sink, then copied with shifted keys by INSERT …
// SELECT in time order, 10,000 keys at a time (the copies' scd_hash is the
// template's: only an event at a version's own sequence compares it; their
// side rows are not copied: none is needed), then VACUUM ANALYZE and CHECKPOINT,
// as autovacuum would leave a table that has settled. The workload's
// sequences come after every preloaded version's. PostgreSQL's cache is
// as the preload leaves it (shared_buffers 512 MB; the kernel's page
// cache holds what fits of the table in the machine's memory).
func BenchmarkSize(b *testing.B) {
	sizes := []int{0, 1_000_000, 10_000_000}
	if env := os.Getenv("BENCH_SIZES"); env != "" {
		sizes = []int{0}
		for _, f := range strings.Split(env, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				b.Fatalf("BENCH_SIZES: %q is not a number of versions", f)
			}
			if n > 0 {
				sizes = append(sizes, n)
			}
		}
	}
	pool := benchPool(b)
	if _, err := pool.Exec(context.Background(), "CREATE EXTENSION IF NOT EXISTS btree_gist"); err != nil {
		b.Fatal(err)
	}
	for _, layout := range []struct {
		name, interval string
		noOverlap      bool
	}{{"plain", "", false}, {"partitioned", "month", false}, {"no_overlap", "", true}} {
		b.Run(layout.name, func(b *testing.B) {
			var empty, smallest sizeResult
			for _, size := range sizes {
				b.Run(fmt.Sprintf("versions=%d", size), func(b *testing.B) {
					for iter := 0; iter < b.N; iter++ {
						r := benchSize(b, pool, layout.interval, layout.noOverlap, size, fmt.Sprintf("size_%s_%d_%d", layout.name, size, iter))
						if size == 0 {
							empty = r
						} else if empty.newEPS > 0 {
							b.ReportMetric(r.newEPS/empty.newEPS, "ratio_to_empty")
							b.ReportMetric(r.pgInsert/empty.pgInsert, "pg_insert_ratio_to_empty")
							b.Logf("%s, %d versions, new keys: %.0f events/s, %.2f of the empty table's %.0f; PostgreSQL's INSERT alone: %.2f of the empty table's",
								layout.name, size, r.newEPS, r.newEPS/empty.newEPS, empty.newEPS, r.pgInsert/empty.pgInsert)
						}
						if r.existingEPS > 0 {
							if smallest.existingEPS == 0 {
								smallest = r
							}
							b.ReportMetric(r.existingEPS/smallest.existingEPS, "existing_ratio_to_smallest")
							b.ReportMetric(r.pgClose/smallest.pgClose, "pg_close_ratio_to_smallest")
							b.Logf("%s, %d versions, existing keys: %.0f events/s, %.2f of the smallest table's %.0f; PostgreSQL's close alone: %.2f of the smallest table's",
								layout.name, size, r.existingEPS, r.existingEPS/smallest.existingEPS, smallest.existingEPS, r.pgClose/smallest.pgClose)
						}
					}
				})
			}
		})
	}
}

// sizeResult is what benchSize measured: events/s of the workload on new
// keys and (0 when the table has too few keys) on existing ones, and the
// least SQL's rates on the same table.
type sizeResult struct {
	newEPS, existingEPS float64
	// PostgreSQL's own rates on the same table (rows/s): inserting the
	// rows the "new" workload wrote, and closing one current version per
	// key of 50,000 preloaded keys (0 when too few).
	pgInsert, pgClose float64
}

// benchSize preloads a table of size versions in schema, applies the
// workloads and measures.
func benchSize(b *testing.B, pool *pgxpool.Pool, interval string, noOverlap bool, size int, schema string) sizeResult {
	ctx := context.Background()
	b.StopTimer()
	spec := benchSpec(schema)
	spec.Partitioning = sink.Partitioning{Interval: interval}
	spec.NoOverlap = noOverlap // history_constraint: no_overlap
	hist := pgx.Identifier{schema, spec.Target}.Sanitize()
	b.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	keys := size / sizeVersionsPerKey
	if size > 0 {
		start := time.Now()
		preload(b, pool, spec, keys)
		b.Logf("preloaded %d versions (%d keys) in %s", size, keys, time.Since(start).Round(time.Second))
	}
	s, err := sink.New(sink.Config{Schema: schema, Tables: []sink.TableSpec{spec}}, pool)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Init(ctx); err != nil {
		b.Fatal(err)
	}
	// The workload, twice. First "new": BenchmarkApply's "mixed", its
	// 50,000 keys new ones among the preloaded (the same events as into
	// the empty table: what differs is only the table's size). Then
	// "existing": the same events on 50,000 preloaded keys spread over the
	// key space, whose current versions and state are read from the large
	// table (only when it has that many keys).
	run := func(mode string, idOf func(k int) int) float64 {
		evs := scdtest.BenchEvents(rand.New(rand.NewPCG(1, 2)), spec.Target, benchKeys, benchEvents, 100)
		for i, e := range evs {
			k, _ := strconv.Atoi(string(e.Key[0].(json.Number)))
			id := json.Number(strconv.Itoa(idOf(k)))
			e.Key[0], e.After["id"] = id, id
			e.Seq = change.MustSeq(int64(10_000_000 + i + 1))
		}
		statements := os.Getenv("BENCH_STATEMENTS") != ""
		if statements {
			if _, err := pool.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
				b.Fatalf("BENCH_STATEMENTS needs pg_stat_statements: %v", err)
			}
		}
		b.StartTimer()
		start := time.Now()
		events := applyPipelined(b, s, "bench_"+mode, evs)
		dur := time.Since(start)
		b.StopTimer()
		if statements {
			scdtest.LogStatements(b, pool, 8)
		}
		eps := float64(events) / dur.Seconds()
		b.Logf("%s keys: %d events in %s, %.0f events/s", mode, events, dur.Round(time.Millisecond), eps)
		return eps
	}
	// Preloaded keys are multiples of 4, new ones 1 more: both spread
	// over the lower half of the key space (a new key's index entry
	// lands among the old ones'). PostgreSQL's own cost is measured on
	// keys spread likewise over the upper half (below), whose index
	// pages the workload has not read: its cache helps neither.
	half := keys / 2
	stride := max(1, half/benchKeys)
	res := sizeResult{newEPS: run("new", func(k int) int { return 4*k*stride + 1 })}
	b.ReportMetric(res.newEPS, "events/s")
	if keys >= benchKeys {
		res.existingEPS = run("existing", func(k int) int { return 4 * k * stride })
		b.ReportMetric(res.existingEPS, "existing_events/s")
	}

	var rows, tableBytes, indexBytes int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+hist+`),
		sum(pg_table_size(r)), sum(pg_indexes_size(r))
		FROM (SELECT relid FROM pg_partition_tree($1::regclass) UNION SELECT $1::regclass) t(r)`, hist).Scan(&rows, &tableBytes, &indexBytes); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(tableBytes)/(1<<20), "table_MiB")
	b.ReportMetric(float64(indexBytes)/(1<<20), "index_MiB")

	// verify, with the peaks of the Go heap and of RSS while it runs.
	runtime.GC()
	debug.FreeOSMemory()
	baseHeap := heapBytes()
	baseRSS := statusBytes(b, "VmRSS:")
	resetPeakRSS(b)
	stop := make(chan struct{})
	var peakHeap uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			peakHeap = max(peakHeap, heapBytes())
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	vstart := time.Now()
	vs, err := s.Verify(ctx, spec.Target)
	vdur := time.Since(vstart)
	close(stop)
	wg.Wait()
	if err != nil || len(vs) > 0 {
		b.Fatalf("verify: %v %v", err, vs)
	}
	rss := statusBytes(b, "VmHWM:") - baseRSS
	b.ReportMetric(vdur.Seconds(), "verify_s")
	b.ReportMetric(float64(peakHeap-min(peakHeap, baseHeap))/(1<<20), "verify_heap_growth_MiB")
	b.ReportMetric(float64(rss)/(1<<20), "verify_rss_growth_MiB")

	// _as_of: one key's versions at a time inside the preloaded history,
	// and the whole table at that time.
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	asOf := pgx.Identifier{schema, spec.Target + "_as_of"}.Sanitize()
	rng := rand.New(rand.NewPCG(3, 4))
	const probes = 200
	kstart := time.Now()
	for range probes {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+asOf+`($1) WHERE id = $2`, at, 4*rng.IntN(max(keys, benchKeys))).Scan(&n); err != nil {
			b.Fatal(err)
		}
	}
	keyDur := time.Since(kstart) / probes
	tstart := time.Now()
	var live int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+asOf+`($1)`, at).Scan(&live); err != nil {
		b.Fatal(err)
	}
	tableDur := time.Since(tstart)
	b.ReportMetric(float64(keyDur.Microseconds())/1000, "as_of_key_ms")
	b.ReportMetric(tableDur.Seconds(), "as_of_table_s")
	b.Logf("%d rows (table %d MiB, indexes %d MiB); verify %s (Go heap +%d MiB, RSS +%d MiB); _as_of one key %s, whole table %s (%d rows)",
		rows, tableBytes>>20, indexBytes>>20, vdur.Round(time.Millisecond),
		(peakHeap-min(peakHeap, baseHeap))>>20, rss>>20, keyDur.Round(time.Microsecond), tableDur.Round(time.Millisecond), live)
	res.pgInsert, res.pgClose = pgOwnRates(b, pool, schema, hist, half, stride, keys >= benchKeys)
	return res
}

// pgOwnRates measures, in transactions rolled back, what PostgreSQL alone
// does with the table: an INSERT … SELECT of the rows the "new" workload
// wrote (keys 4·k·stride+1, in the lower half of the key space), moved to
// keys of their own in the upper half (4·(half+k·stride)+3: index pages
// the workload did not touch), and (withClose) an UPDATE that closes the
// current version of 50,000 preloaded keys of the upper half
// (4·(half+k·stride)), as the least SQL of a workload on new and on
// existing keys does. It returns rows/s of each.
func pgOwnRates(b *testing.B, pool *pgxpool.Pool, schema, hist string, half, stride int, withClose bool) (insert, closes float64) {
	b.Helper()
	ctx := context.Background()
	newIDs := make([]int64, benchKeys)
	other := make([]int64, benchKeys)
	for k := range benchKeys {
		newIDs[k] = int64(4*k*stride + 1)
		other[k] = int64(4 * (half + k*stride))
	}
	probe := pgx.Identifier{schema, "pg_probe"}.Sanitize()
	var cols []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(quote_ident(attname) ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attname <> 'scd_id'`, hist).Scan(&cols); err != nil {
		b.Fatal(err)
	}
	list := strings.Join(cols, ", ")
	// In random key order, as the sink's batches come: rows in key order
	// would walk the index's leaves in order.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s AS SELECT %s FROM %s WHERE id = ANY($1::bigint[]) ORDER BY random()`, probe, list, hist), newIDs); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET id = id + %d`, probe, 4*half+2)); err != nil {
		b.Fatal(err)
	}
	rand.New(rand.NewPCG(5, 6)).Shuffle(len(other), func(i, j int) { other[i], other[j] = other[j], other[i] })
	timed := func(q string, args ...any) float64 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		start := time.Now()
		tag, err := tx.Exec(ctx, q, args...)
		if err != nil {
			b.Fatal(err)
		}
		return float64(tag.RowsAffected()) / time.Since(start).Seconds()
	}
	insert = timed(fmt.Sprintf(`INSERT INTO %s (%s) SELECT %s FROM %s`, hist, list, list, probe))
	b.ReportMetric(insert, "pg_insert_rows/s")
	if withClose {
		closes = timed(fmt.Sprintf(`UPDATE %s h SET valid_to = $2, is_current = false FROM unnest($1::bigint[]) AS k(id) WHERE h.id = k.id AND h.is_current`, hist),
			other, time.Date(2026, 1, 1, 0, 30, 0, 0, time.UTC))
		b.ReportMetric(closes, "pg_close_rows/s")
	}
	b.Logf("PostgreSQL alone: INSERT … SELECT of the new keys' rows %.0f rows/s; a close of 50,000 current versions %.0f rows/s", insert, closes)
	return insert, closes
}

// applyPipelined applies evs in batches of benchBatch, preparing the next
// batch while the previous one is applied, as the pipeline does; it
// returns the events applied.
func applyPipelined(b *testing.B, s *sink.Sink, topic string, evs []*change.Event) int {
	b.Helper()
	ctx := context.Background()
	prepared := make(chan *sink.Prepared, 1)
	go func() {
		defer close(prepared)
		for i := 0; i < len(evs); i += benchBatch {
			p, err := s.Prepare(ctx, sink.Batch{Events: evs[i:min(i+benchBatch, len(evs))],
				Positions: sink.At(map[change.Partition]int64{{Topic: topic}: int64(i + benchBatch)})})
			if err != nil {
				b.Error(err)
				return
			}
			prepared <- p
		}
	}()
	events := 0
	for p := range prepared {
		r, err := s.ApplyPrepared(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		events += r.Events
	}
	return events
}

// preload fills spec's history table with keys keys of
// sizeVersionsPerKey versions each (ids 0, 4, … 4·keys-4): a template
// applied through the sink, copied in time order.
func preload(b *testing.B, pool *pgxpool.Pool, spec sink.TableSpec, keys int) {
	b.Helper()
	ctx := context.Background()
	template := min(keys, 10_000)
	s, err := sink.New(sink.Config{Schema: spec.Schema, Tables: []sink.TableSpec{spec}}, pool)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Init(ctx); err != nil {
		b.Fatal(err)
	}
	plans := []string{"basic", "pro", "team", "enterprise"}
	base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	evs := make([]*change.Event, 0, template*sizeVersionsPerKey)
	for v := range sizeVersionsPerKey {
		for k := range template {
			op := change.OpUpdate
			if v == 0 {
				op = change.OpCreate
			}
			id := json.Number(strconv.Itoa(4 * k))
			evs = append(evs, &change.Event{Table: spec.Target, Key: []any{id}, Seq: change.MustSeq(int64(v*template + k + 1)), Op: op,
				ValidFrom: base.Add(time.Duration(v)*60*24*time.Hour + time.Duration(k)*time.Second),
				After:     map[string]any{"id": id, "name": fmt.Sprintf("customer %d", k), "plan": plans[(k+v)%4], "city": "Wien", "score": json.Number(strconv.Itoa(v))},
				Origin:    change.Origin{Partition: change.Partition{Topic: "template"}, Offset: int64(len(evs))}})
		}
	}
	applyPipelined(b, s, "template", evs)
	hist := pgx.Identifier{spec.Schema, spec.Target}.Sanitize()
	var cols []string
	rows, err := pool.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attname <> 'scd_id' ORDER BY attnum`, hist)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			b.Fatal(err)
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	sel := make([]string, len(cols))
	for i, c := range cols {
		sel[i] = pgx.Identifier{c}.Sanitize()
		if c == "id" {
			sel[i] = "id + $1::bigint"
		}
	}
	// In time order, as a table fills: a key's versions are on as many
	// pages as it has versions.
	copyStmt := fmt.Sprintf(`INSERT INTO %s (%s) SELECT %s FROM %s WHERE id < %d ORDER BY scd_seq, id`,
		hist, strings.Join(quoteAll(cols), ", "), strings.Join(sel, ", "), hist, 4*template)
	for m := 1; m*template < keys; m++ {
		if _, err := pool.Exec(ctx, copyStmt, 4*m*template); err != nil {
			b.Fatalf("copying the template: %v", err)
		}
	}
	// And a checkpoint: the preload's dirty pages are not written back
	// while the workload is measured.
	for _, q := range []string{"VACUUM ANALYZE " + hist, "CHECKPOINT"} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = pgx.Identifier{n}.Sanitize()
	}
	return out
}

var heapSample = []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}

func heapBytes() uint64 {
	metrics.Read(heapSample)
	return heapSample[0].Value.Uint64()
}

// resetPeakRSS resets this process's VmHWM (Linux: writing 5 to clear_refs).
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset the peak RSS: %v", err)
	}
}

// statusBytes reads a field of this process's /proc/self/status (VmHWM:,
// VmRSS:) in bytes.
func statusBytes(b *testing.B, field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == field {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
