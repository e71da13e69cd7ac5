package sink_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// seqScans returns how often PostgreSQL has scanned a table sequentially,
// once its statistics of the sink's transactions have been flushed.
func seqScans(t *testing.T, pool *pgxpool.Pool, schema, table string) int64 {
	t.Helper()
	ctx := context.Background()
	time.Sleep(1500 * time.Millisecond) // backends flush their counters at most once a second
	var n int64
	if err := pool.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBatchesProbeKeys: a batch touches its keys through the history
// table's key index, never by scanning the table, even when the planner's
// statistics are stale (analyzed while few keys held many versions), and
// for the Type 1 update of older versions, matched on the key alone.
func TestBatchesProbeKeys(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	s := newSink(t, pool, "public", custSpec("public"))
	if _, err := pool.Exec(ctx, `ALTER TABLE customers_history SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	seq := int64(0)
	next := func() int64 { seq++; return seq }
	var evs []*change.Event
	for k := range 10 { // few keys, many versions each: then ANALYZE
		for i := range 100 {
			evs = append(evs, cust(change.OpUpdate, next(), day.Add(time.Duration(seq)*time.Second), fmt.Sprint(k), "name", "n", "plan", fmt.Sprint(i)))
		}
	}
	apply(t, s, evs...)
	if _, err := pool.Exec(ctx, `ANALYZE customers_history`); err != nil {
		t.Fatal(err)
	}
	evs = nil
	for k := 10; k < 20_000; k++ { // many keys since
		evs = append(evs, cust(change.OpRead, next(), day.Add(time.Duration(seq)*time.Second), fmt.Sprint(k), "name", "n", "plan", "basic"))
	}
	apply(t, s, evs...)
	before := seqScans(t, pool, "public", "customers_history")
	evs = nil
	for k := 0; k < 2_000; k += 10 { // Type 1 changes: every version of the key takes them
		evs = append(evs, cust(change.OpUpdate, next(), day.Add(time.Duration(seq)*time.Second), fmt.Sprint(k), "name", "renamed", "plan", "basic"))
	}
	for k := 5; k < 2_000; k += 10 { // tracked changes: close and open
		evs = append(evs, cust(change.OpUpdate, next(), day.Add(time.Duration(seq)*time.Second), fmt.Sprint(k), "name", "n", "plan", "pro"))
	}
	apply(t, s, evs...)
	if after := seqScans(t, pool, "public", "customers_history"); after != before {
		t.Fatalf("the batch scanned customers_history sequentially %d times", after-before)
	}
	verifyClean(t, s, "customers_history")
}

// TestBatchPlannerOptions: a batch's transaction probes key indexes
// (no sequential scan, hash or merge join) and, over plain history
// tables, keeps one plan per prepared statement (plan_cache_mode
// force_generic_plan); when one of its tables is partitioned it leaves
// PostgreSQL to plan afresh (a kept plan locks every partition). A
// trigger on the (plain) customers history table records the settings
// its inserts ran under; the second batch carries its offsets, so its
// settings go in the fence's pipeline.
func TestBatchPlannerOptions(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	ctx := context.Background()
	acct := func(op change.Op, seq int64, at time.Time, id string, kv ...any) *change.Event {
		ev := cust(op, seq, at, id, kv...)
		ev.Table, ev.Origin.Topic = "accounts_history", "shop.public.accounts"
		return ev
	}
	for _, tc := range []struct {
		name     string
		accounts bool // a partitioned accounts table in the batches too
		want     string
	}{
		{"plain", false, "force_generic_plan"},
		{"with a partitioned table", true, "auto"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schema := fmt.Sprintf("plans_%t", tc.accounts)
			specs := []sink.TableSpec{custSpec(schema)}
			if tc.accounts {
				accounts := custSpec(schema)
				accounts.Target = "accounts_history"
				accounts.Partitioning = sink.Partitioning{Interval: "month", Ahead: 2}
				specs = append(specs, accounts)
			}
			s := newSink(t, pool, schema, specs...)
			batch := func(offset int64, evs ...*change.Event) {
				t.Helper()
				if !tc.accounts {
					evs = evs[:len(evs)-1]
				}
				p := change.Partition{Topic: "shop.public.customers"}
				if _, err := s.Apply(ctx, sink.Batch{Events: evs, Positions: sink.At(map[change.Partition]int64{p: offset})}); err != nil {
					t.Fatal(err)
				}
			}
			batch(1,
				cust(change.OpCreate, 10, day, "C1", "name", "Ann", "plan", "basic", "city", "Wien", "visits", 1),
				acct(change.OpCreate, 10, day, "A1", "name", "Bo", "plan", "basic", "city", "Linz", "visits", 1))
			if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s.seen (mode text, seqscan text, hashjoin text);
				CREATE FUNCTION %[1]s.note() RETURNS trigger LANGUAGE plpgsql AS
				$$ BEGIN INSERT INTO %[1]s.seen VALUES (current_setting('plan_cache_mode'), current_setting('enable_seqscan'), current_setting('enable_hashjoin')); RETURN NULL; END $$;
				CREATE TRIGGER note AFTER INSERT ON %[1]s.customers_history FOR EACH ROW EXECUTE FUNCTION %[1]s.note()`, schema)); err != nil {
				t.Fatal(err)
			}
			batch(3,
				cust(change.OpUpdate, 20, day.AddDate(0, 0, 1), "C1", "name", "Ann", "plan", "pro", "city", "Wien", "visits", 2),
				cust(change.OpCreate, 21, day.AddDate(0, 0, 1), "C2", "name", "Bo", "plan", "basic", "city", "Graz", "visits", 1),
				acct(change.OpUpdate, 20, day.AddDate(0, 0, 1), "A1", "name", "Bo", "plan", "pro", "city", "Linz", "visits", 2))
			var n int
			var mode, seqscan, hashjoin string
			if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), min(mode), min(seqscan), min(hashjoin) FROM %s.seen`, schema)).Scan(&n, &mode, &seqscan, &hashjoin); err != nil {
				t.Fatal(err)
			}
			if n != 2 || mode != tc.want || seqscan != "off" || hashjoin != "off" {
				t.Fatalf("%d inserts under plan_cache_mode %s, enable_seqscan %s, enable_hashjoin %s; want 2 under %s, off, off", n, mode, seqscan, hashjoin, tc.want)
			}
			// Outside the batch's transaction, the settings are the server's.
			if err := pool.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&mode); err != nil || mode != "auto" {
				t.Fatalf("plan_cache_mode outside the batch: %q, %v", mode, err)
			}
		})
	}
}
