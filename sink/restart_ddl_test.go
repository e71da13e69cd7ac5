package sink_test

import (
	"context"
	"strings"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
)

// TestRestartRunsNoDDL: a restart over tables it created (the service's
// own and a history table, snapshot_deletes on) runs no DDL at all, at
// Init or at its first batch: every table the service creates is in the
// catalog it reads, so nothing is created "if not exists" again.
func TestRestartRunsNoDDL(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	spec.SnapshotDeletes = true
	s := newSink(t, pool, "public", spec)
	apply(t, s, cust(change.OpCreate, 1, day, "A", "name", "a", "plan", "p"))
	if _, err := pool.Exec(ctx, `CREATE TABLE ddl_log (tag text, cmd text);
		CREATE FUNCTION log_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO ddl_log VALUES (tg_tag, current_query()); END $$;
		CREATE EVENT TRIGGER log_ddl ON ddl_command_start EXECUTE FUNCTION log_ddl()`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP EVENT TRIGGER IF EXISTS log_ddl`) })
	restarted := newSink(t, pool, "public", spec)
	apply(t, restarted, cust(change.OpUpdate, 2, day.Add(1), "A", "name", "a", "plan", "q"))
	rows, err := pool.Query(ctx, `SELECT tag || ': ' || left(cmd, 120) FROM ddl_log`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ran []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		ran = append(ran, l)
	}
	if len(ran) > 0 {
		t.Fatalf("a restart ran %d DDL statements:\n%s", len(ran), strings.Join(ran, "\n"))
	}
}
