package scdtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// LogStatements logs the n statements that took the most time since
// pg_stat_statements was reset, and the sum over all of them
// (BENCH_STATEMENTS=1 in the benchmarks that call it, with the extension
// loaded, e.g. SCD2SINK_TEST_DSN pointing at such a server).
func LogStatements(tb testing.TB, pool *pgxpool.Pool, n int) {
	tb.Helper()
	ctx := context.Background()
	var total, plan, calls int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(round(sum(total_exec_time)), 0)::bigint, coalesce(round(sum(total_plan_time)), 0)::bigint,
		coalesce(sum(calls), 0)::bigint FROM pg_stat_statements`).Scan(&total, &plan, &calls); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("  statements: %d ms executing and %d ms planning (with pg_stat_statements.track_planning) in %d calls", total, plan, calls)
	rows, err := pool.Query(ctx, `SELECT round(total_exec_time)::bigint, calls, shared_blks_hit, shared_blks_read,
		left(regexp_replace(query, '\s+', ' ', 'g'), 140) FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var ms, calls, hit, read int64
		var q string
		if err := rows.Scan(&ms, &calls, &hit, &read, &q); err != nil {
			tb.Fatal(err)
		}
		tb.Logf("  %6d ms %5d calls %9d hit %8d read  %s", ms, calls, hit, read, q)
	}
}
