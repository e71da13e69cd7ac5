package app

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
)

// TestCountVersions: `tables` counts a table's versions exactly while
// PostgreSQL estimates it below a million rows, and shows the estimate,
// marked "~", above (counting hundreds of big tables would take minutes).
func TestCountVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE v (id int); INSERT INTO v SELECT generate_series(1, 1234); ANALYZE v`); err != nil {
		t.Fatal(err)
	}
	if got := countVersions(ctx, pool, "public.v"); got != "1234" {
		t.Errorf("small table: %q, want 1234", got)
	}
	// What ANALYZE would say of a big table (set by hand: the test runs as a superuser).
	if _, err := pool.Exec(ctx, `UPDATE pg_class SET reltuples = 2500000 WHERE oid = 'v'::regclass`); err != nil {
		t.Fatal(err)
	}
	if got := countVersions(ctx, pool, "public.v"); got != "~2500000" {
		t.Errorf("big table: %q, want ~2500000", got)
	}
	if got := countVersions(ctx, pool, "public.missing"); got != "?" {
		t.Errorf("missing table: %q, want ?", got)
	}
}
