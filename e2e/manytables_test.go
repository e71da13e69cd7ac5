//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// manyTable is the n-th generated table: a key, a text that every update
// changes (so that each insert or update is a version) and a number.
func manyTable(n int) srcTable {
	name := fmt.Sprintf("m%03d", n)
	return srcTable{name, sink.TableSpec{Target: name + "_history", Schema: "public", Keys: []string{"id"}}, []string{"v", "n"}}
}

// createManyTable creates a generated table with its audit trigger.
func createManyTable(t *testing.T, ctx context.Context, src sourceDB, n int) {
	t.Helper()
	name := manyTable(n).name
	if _, err := src.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (id int PRIMARY KEY, v text NOT NULL, n int);
		CREATE TRIGGER %[1]s_audit AFTER INSERT OR UPDATE OR DELETE ON %[1]s FOR EACH ROW EXECUTE FUNCTION audit()`, name)); err != nil {
		t.Fatal(err)
	}
}

// manyWork changes the generated tables 0..n-1: each transaction inserts,
// updates or deletes a few rows of one or two tables.
func manyWork(ctx context.Context, src sourceDB, rng *rand.Rand, live map[int]map[int]bool, tables, txs int) error {
	for i := 0; i < txs; i++ {
		tx, err := src.pool.Begin(ctx)
		if err != nil {
			return err
		}
		for range 1 + rng.IntN(2) {
			tb := rng.IntN(tables)
			if live[tb] == nil {
				live[tb] = map[int]bool{}
			}
			name := manyTable(tb).name
			id := 1 + rng.IntN(12)
			var q string
			switch {
			case !live[tb][id]:
				q, live[tb][id] = fmt.Sprintf(`INSERT INTO %s (id, v, n) VALUES ($1, md5(random()::text), 0)`, name), true
			case rng.IntN(6) == 0:
				q, live[tb][id] = fmt.Sprintf(`DELETE FROM %s WHERE id = $1`, name), false
			default:
				q = fmt.Sprintf(`UPDATE %s SET v = md5(random()::text), n = n + 1 WHERE id = $1`, name)
			}
			if _, err := tx.Exec(ctx, q, id); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// TestWholeConnector: one connector captures 50 generated tables (one topic
// each) and scd2sink reads them through one topic_pattern entry; midway a
// 51st table is created at the source, which Debezium picks up (its
// publication covers all tables, its include list is a pattern) and
// scd2sink consumes without a restart. Every history equals the fold of
// the source's audit log, and the completeness watermark read during the
// run is never ahead of what is applied.
func TestWholeConnector(t *testing.T) {
	skipOnCompose(t)
	ctx := context.Background()
	const tables = 50
	st := newStackWith(t, ctx, stackOpts{capture: `public[.]m[0-9]+`, connector: "publication.autocreate.mode=all_tables\n",
		before: func(st *stack) {
			for i := 0; i < tables; i++ {
				createManyTable(t, ctx, st.src, i)
			}
		}})
	sinkProc := runSinkTables(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN, `tables:
  - topic_pattern: 'shop\.public\.m\d+'
    target: "{table}_history"
`)
	rng := rand.New(rand.NewPCG(15, 1))
	live := map[int]map[int]bool{}
	if err := manyWork(ctx, st.src, rng, live, tables, 300); err != nil {
		t.Fatal(err)
	}
	// A table added to the connector while everything runs.
	createManyTable(t, ctx, st.src, tables)
	added := time.Now()
	stop := make(chan struct{})
	checked := make(chan string, 1)
	go func() { checked <- watchWatermarks(ctx, st, stop) }()
	if err := manyWork(ctx, st.src, rng, live, tables+1, 300); err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := 0; i <= tables; i++ {
		tb := manyTable(i)
		want := truth(t, ctx, st.src, tb)
		var got []string
		err := waitFor(ctx, 120*time.Second, func() (bool, error) {
			var exists bool
			if err := st.tpool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, "public."+tb.spec.Target).Scan(&exists); err != nil || !exists {
				return false, err
			}
			got = stripSeq(scdtest.HistoryLines(t, st.tpool, tb.spec, tb.cols))
			return scdtest.DiffLines(want, got) == "", nil
		})
		if err != nil {
			t.Fatalf("%s never matched the source (%d expected, %d got versions): %v\n%s\n%s", tb.spec.Target, len(want), len(got), err,
				scdtest.DiffLines(want, got), sinkProc.tail(20))
		}
		if i == tables {
			t.Logf("the table added midway: %d versions, its history current %v after it was created", len(want), time.Since(added).Round(time.Millisecond))
		}
		n += len(want)
	}
	close(stop)
	if msg := <-checked; !strings.HasPrefix(msg, "ok: ") {
		t.Fatal(msg)
	} else {
		t.Log(msg)
	}
	t.Logf("51 tables through one topic_pattern entry: every history equals the source's audit log, %d versions", n)
}

// watchWatermarks reads scd2sink_watermarks every 200 ms until stop: for
// each target with a watermark W, every insert or update whose commit (in
// ms, Debezium's source.ts_ms) is at or before W must be a version in the
// history. It returns what was wrong, or "ok: " and what it read.
func watchWatermarks(ctx context.Context, st *stack, stop <-chan struct{}) string {
	reads, targets := 0, map[string]bool{}
	var bad []string
	for {
		select {
		case <-stop:
			if reads == 0 {
				return "the watermark was never read"
			}
			if len(bad) > 0 {
				return strings.Join(bad, "\n")
			}
			return fmt.Sprintf("ok: %d reads of %d targets' watermarks, none ahead of the history", reads, len(targets))
		case <-time.After(200 * time.Millisecond):
		}
		rows, err := st.tpool.Query(ctx, `SELECT target, complete_through FROM scd2sink_watermarks WHERE complete_through IS NOT NULL`)
		if err != nil {
			continue
		}
		marks := map[string]time.Time{}
		for rows.Next() {
			var target string
			var w time.Time
			if rows.Scan(&target, &w) == nil {
				marks[target] = w
			}
		}
		rows.Close()
		for target, w := range marks {
			table := strings.TrimSuffix(target, "_history")
			var want, have int
			if err := st.src.pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE tbl = $1 AND op IN ('I', 'U')
				AND date_trunc('milliseconds', pg_xact_commit_timestamp(xmin)) <= $2`, table, w).Scan(&want); err != nil {
				continue
			}
			if err := st.tpool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE valid_from <= $1`, target), w).Scan(&have); err != nil {
				continue
			}
			reads++
			targets[target] = true
			if have < want {
				bad = append(bad, fmt.Sprintf("%s: complete through %s, but %d of the %d versions up to then are applied", target, w.Format(time.RFC3339Nano), have, want))
			}
		}
	}
}
