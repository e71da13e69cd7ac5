package sink_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
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
