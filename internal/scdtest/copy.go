package scdtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchColumns are the columns of the benchmark history tables (BenchEvents).
var BenchColumns = []string{"id", "name", "plan", "city", "score", "valid_from", "valid_to", "is_current",
	"scd_seq", "scd_close_seq", "scd_op", "scd_hash", "scd_unavailable", "scd_absent", "scd_raw_t", "scd_attnum"}

// CopyBaseline is the benchmarks' yardstick: it reads the rows of the
// history table src, creates dst with the same shape and indexes (LIKE ...
// INCLUDING ALL), and COPYs the rows into it, batch rows per transaction. It
// returns the number of rows and the time of the COPYs alone.
func CopyBaseline(tb testing.TB, pool *pgxpool.Pool, src, dst pgx.Identifier, cols []string, batch int) (int, time.Duration) {
	tb.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING ALL)", dst.Sanitize(), src.Sanitize())); err != nil {
		tb.Fatal(err)
	}
	quoted := make([]string, len(cols))
	for i, c := range cols {
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	rows, err := pool.Query(ctx, fmt.Sprintf("SELECT %s FROM %s ORDER BY scd_id", strings.Join(quoted, ", "), src.Sanitize()))
	if err != nil {
		tb.Fatal(err)
	}
	var all [][]any
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			tb.Fatal(err)
		}
		all = append(all, v)
	}
	rows.Close()
	start := time.Now()
	for i := 0; i < len(all); i += batch {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, dst, cols, pgx.CopyFromRows(all[i:min(i+batch, len(all))]))
			return err
		})
		if err != nil {
			tb.Fatal(err)
		}
	}
	return len(all), time.Since(start)
}
