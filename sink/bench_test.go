package sink_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

const (
	benchKeys   = 50_000
	benchEvents = 200_000
	benchBatch  = 10_000
)

func benchSpec(schema string) sink.TableSpec {
	return sink.TableSpec{Target: "bench_history", Schema: schema, Keys: []string{"id"},
		Columns: []sink.Column{{Name: "id", Type: "bigint"}, {Name: "name", Type: "text"}, {Name: "plan", Type: "text"},
			{Name: "city", Type: "text"}, {Name: "score", Type: "bigint"}},
		TrackHistory: []string{"plan", "city", "score"}}
}

// BenchmarkApply applies 200,000 events (50,000 keys, mostly tracked
// updates) in batches of 10,000, then COPYs the resulting rows into a table
// of the same shape and indexes, and reports both rates and their ratio.
// "mixed" has 10% Type-1-only updates (each rewrites every version of its
// key, type1_scope all_versions); "tracked" has none; "tracked-partitioned"
// is "tracked" into a table partitioned by month (partition.go): closing
// a version moves its row out of the current versions' partition.
func BenchmarkApply(b *testing.B) {
	pool := benchPool(b)
	for _, w := range []struct {
		name     string
		perMill  int
		workers  int
		interval string
	}{{"mixed", 100, 1, ""}, {"tracked", 0, 1, ""}, {"tracked-partitioned", 0, 1, "month"}, {"tracked-2-workers", 0, 2, ""}} {
		b.Run(w.name, func(b *testing.B) {
			evs := scdtest.BenchEvents(rand.New(rand.NewPCG(1, 2)), "bench_history", benchKeys, benchEvents, w.perMill)
			if w.workers > 1 {
				// Four partitions by key, applied by w.workers transactions side by side.
				for _, e := range evs {
					id, _ := strconv.Atoi(fmt.Sprint(e.Key[0]))
					e.Origin.Partition = change.Partition{Topic: "bench", Partition: int32(id % 4)}
				}
			}
			benchApply(b, pool, strings.ReplaceAll(w.name, "-", "_"), evs, w.workers, w.interval)
		})
	}
}

func benchApply(b *testing.B, pool *pgxpool.Pool, name string, evs []*change.Event, workers int, interval string) {
	ctx := context.Background()
	for iter := 0; iter < b.N; iter++ {
		schema := fmt.Sprintf("bench_%s_%d", name, iter)
		spec := benchSpec(schema)
		spec.Partitioning = sink.Partitioning{Interval: interval}
		s, err := sink.New(sink.Config{Schema: schema, Tables: []sink.TableSpec{spec}, ApplyWorkers: workers}, pool)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Init(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		var res sink.Result
		// The pipeline prepares the next batch while the previous one is applied.
		prepared := make(chan *sink.Prepared, 1)
		go func() {
			defer close(prepared)
			for i := 0; i < len(evs); i += benchBatch {
				offsets := map[change.Partition]int64{}
				for p := range max(1, 4*min(workers-1, 1)) {
					offsets[change.Partition{Topic: "bench", Partition: int32(p)}] = int64(i + benchBatch)
				}
				p, err := s.Prepare(ctx, sink.Batch{Events: evs[i:min(i+benchBatch, len(evs))], Positions: sink.At(offsets)})
				if err != nil {
					b.Error(err)
					return
				}
				prepared <- p
			}
		}()
		for p := range prepared {
			r, err := s.ApplyPrepared(ctx, p)
			if err != nil {
				b.Fatal(err)
			}
			res.Events += r.Events
			res.VersionsOpened += r.VersionsOpened
		}
		applyDur := time.Since(start)
		b.StopTimer()
		rows, copyDur := scdtest.CopyBaseline(b, pool, pgx.Identifier{schema, "bench_history"}, pgx.Identifier{schema, "bench_copy"}, scdtest.BenchColumns, benchBatch)
		eps := float64(res.Events) / applyDur.Seconds()
		rps := float64(rows) / copyDur.Seconds()
		b.ReportMetric(eps, "events/s")
		b.ReportMetric(rps, "copy_rows/s")
		b.ReportMetric(eps/rps, "ratio")
		b.Logf("applied %d events (%d versions) in %s: %.0f events/s; COPY of %d rows in %s: %.0f rows/s; ratio %.2f",
			res.Events, res.VersionsOpened, applyDur.Round(time.Millisecond), eps, rows, copyDur.Round(time.Millisecond), rps, eps/rps)
		var upd, hot, ins int64
		_ = pool.QueryRow(ctx, "SELECT sum(n_tup_upd), sum(n_tup_hot_upd), sum(n_tup_ins) FROM pg_stat_user_tables WHERE schemaname = $1 AND relname LIKE 'bench\\_history%' AND relname NOT LIKE '%\\_scd\\_%'", schema).Scan(&upd, &hot, &ins)
		b.Logf("history table: %d inserts, %d updates (%d HOT)", ins, upd, hot)
		vs, err := s.Verify(ctx, spec.Target)
		if err != nil || len(vs) > 0 {
			b.Fatalf("verify: %v %v", err, vs)
		}
	}
}

func benchPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	pc, err := pgxpool.ParseConfig(newBenchDSN(b))
	if err != nil {
		b.Fatal(err)
	}
	// As the service runs (internal/app.Pool): JIT off, for the
	// sink's statements and PostgreSQL's own alike.
	pc.ConnConfig.RuntimeParams["jit"] = "off"
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}
