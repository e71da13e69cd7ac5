//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// evoSpec is the history of the source table evo, whose schema changes
// while it is captured; evoCols are every column it ever has but the key.
var (
	evoSpec = sink.TableSpec{Target: "evo_history", Schema: "public", Keys: []string{"id"}}
	evoCols = []string{"name", "qty", "note", "gone", "extra", "remark"}
)

// evoWork changes rows of evo through txs transactions; set gives the
// columns an update sets (an expression per column, $2 a random number).
func evoWork(ctx context.Context, src sourceDB, rng *rand.Rand, live map[int]bool, txs int, set string) error {
	for i := 0; i < txs; i++ {
		id := 1 + rng.IntN(15)
		var q string
		switch {
		case !live[id]:
			q, live[id] = `INSERT INTO evo (id, name) VALUES ($1, 'n' || $2::int::text)`, true
		case rng.IntN(8) == 0:
			q, live[id] = `DELETE FROM evo WHERE id = $1 AND $2::int IS NOT NULL`, false
		case rng.IntN(5) == 0:
			q = `UPDATE evo SET id = id WHERE id = $1 AND $2::int IS NOT NULL` // a no-op update
		default:
			q = `UPDATE evo SET ` + set + ` WHERE id = $1`
		}
		if _, err := src.pool.Exec(ctx, q, id, rng.IntN(4)); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// evoTruth folds the audit log of evo, whose images carry the columns the
// table had at each change, with the reference model: a column an image
// lacks is one the table did not have then (DESIGN.md section 11).
func evoTruth(t *testing.T, ctx context.Context, src sourceDB) []string {
	t.Helper()
	rows, err := src.pool.Query(ctx, `SELECT a.op, date_trunc('milliseconds', pg_xact_commit_timestamp(a.xmin)),
			coalesce(a.old, 'null'::jsonb)::text, coalesce(a.new, 'null'::jsonb)::text
		FROM audit_log a WHERE a.tbl = 'evo' ORDER BY pg_xact_commit_timestamp(a.xmin), a.id`)
	if err != nil {
		t.Fatalf("reading the audit log: %v", err)
	}
	defer rows.Close()
	var evs []*change.Event
	for seq := int64(1); rows.Next(); seq++ {
		var op, oldImg, newImg string
		var at time.Time
		if err := rows.Scan(&op, &at, &oldImg, &newImg); err != nil {
			t.Fatal(err)
		}
		image := func(s string) map[string]any {
			var m map[string]any
			dec := json.NewDecoder(bytes.NewReader([]byte(s)))
			dec.UseNumber()
			if err := dec.Decode(&m); err != nil {
				t.Fatal(err)
			}
			for k, v := range m {
				if n, ok := v.(json.Number); ok {
					m[k] = n.String()
				}
			}
			return m
		}
		ev := &change.Event{Table: evoSpec.Target, Seq: change.MustSeq(seq), ValidFrom: at}
		switch op {
		case "I", "U":
			ev.Op, ev.After = change.OpUpdate, image(newImg)
			if op == "I" {
				ev.Op = change.OpCreate
			}
			ev.Key = []any{ev.After["id"]}
		case "D":
			ev.Op, ev.Key = change.OpDelete, []any{image(oldImg)["id"]}
		}
		evs = append(evs, ev)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return stripSeq(scdtest.ModelLines(evoSpec, evoCols, scdtest.Fold(evoSpec, evoCols, evs)))
}

// TestSchemaEvolution alters a captured table at the source while
// everything runs: a column added, one dropped, int widened to bigint,
// varchar(10) widened to varchar(100), a column renamed, with changes in
// between. Debezium's schema follows each; the history table gains the
// added and renamed columns, widens qty to bigint (name stays text), keeps
// the dropped column with NULL in later versions, and equals the fold of
// the source's audit log, in which no schema change alone opened a
// version.
func TestSchemaEvolution(t *testing.T) {
	skipOnCompose(t)
	ctx := context.Background()
	st := newStackWith(t, ctx, stackOpts{capture: `public[.]evo`, before: func(st *stack) {
		if _, err := st.src.pool.Exec(ctx, `CREATE TABLE evo (id int PRIMARY KEY, name varchar(10), qty int, note text, gone text);
			CREATE TRIGGER evo_audit AFTER INSERT OR UPDATE OR DELETE ON evo FOR EACH ROW EXECUTE FUNCTION audit()`); err != nil {
			t.Fatal(err)
		}
	}})
	sinkProc := runSinkTables(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN, `tables:
  - topic: shop.public.evo
    target: evo_history
`)
	rng := rand.New(rand.NewPCG(16, 1))
	live := map[int]bool{}
	steps := []struct{ alter, set string }{
		{"", `qty = $2::int, note = 'x' || ($2::int % 2)::text, gone = 'g' || $2::int::text`},
		{"ALTER TABLE evo ADD COLUMN extra text", `extra = 'e' || $2::int::text, qty = $2::int`},
		{"ALTER TABLE evo DROP COLUMN gone", `note = 'y' || ($2::int % 2)::text`},
		{"ALTER TABLE evo ALTER COLUMN qty TYPE bigint", `qty = 3000000000 + $2::int`},
		{"ALTER TABLE evo ALTER COLUMN name TYPE varchar(100)", `name = repeat('long name ', 2 + $2::int)`},
		{"ALTER TABLE evo RENAME COLUMN note TO remark", `remark = 'z' || $2::int::text`},
	}
	// Each ALTER TABLE waits until what came before it is applied: the
	// connector is caught up when a migration runs, as in a maintenance
	// window. (Debezium's PostgreSQL connector reads a table's columns
	// from the catalog when its relation changes; one far behind a
	// rename may name older changes by the new name. Here, under CI load,
	// a column's changes once all arrived under the name it got later.)
	caughtUp := func() {
		t.Helper()
		var source, applied int
		if err := waitFor(ctx, 90*time.Second, func() (bool, error) {
			if err := st.src.pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE tbl = 'evo'`).Scan(&source); err != nil {
				return false, err
			}
			// (A version's opener may be in the side table too.)
			err := st.tpool.QueryRow(ctx, `SELECT count(*) FROM (SELECT id, scd_seq FROM evo_history UNION SELECT id, scd_seq FROM evo_history_scd_events) e`).Scan(&applied)
			return err == nil && applied == source, nil
		}); err != nil {
			t.Fatalf("the changes before a schema change were not applied (%d of %d): %v\n%s\n%s", applied, source, err, sinkProc.tail(20), st.conn.proc.tail(20))
		}
	}
	for _, s := range steps {
		if s.alter != "" {
			caughtUp()
			if _, err := st.src.pool.Exec(ctx, s.alter); err != nil {
				t.Fatalf("%s: %v", s.alter, err)
			}
		}
		if err := evoWork(ctx, st.src, rng, live, 40, s.set); err != nil {
			t.Fatal(err)
		}
	}
	want := evoTruth(t, ctx, st.src)
	var got []string
	if err := waitFor(ctx, 90*time.Second, func() (bool, error) {
		var exists bool
		if err := st.tpool.QueryRow(ctx, `SELECT to_regclass('public.evo_history') IS NOT NULL AND
			(SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.evo_history'::regclass AND attname IN ('extra', 'remark')) = 2`).Scan(&exists); err != nil || !exists {
			return false, err
		}
		got = stripSeq(scdtest.HistoryLines(t, st.tpool, evoSpec, evoCols))
		return scdtest.DiffLines(want, got) == "", nil
	}); err != nil {
		t.Fatalf("evo_history never matched the source (%d expected, %d got versions): %v\n%s\n%s\n%s", len(want), len(got), err,
			scdtest.DiffLines(want, got), sinkProc.tail(20), st.conn.proc.tail(20))
	}
	var types string
	if err := st.tpool.QueryRow(ctx, `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
		FROM pg_attribute WHERE attrelid = 'public.evo_history'::regclass AND attname IN ('name', 'qty', 'gone', 'note', 'remark')`).Scan(&types); err != nil {
		t.Fatal(err)
	}
	if types != "name text, qty bigint, note text, gone text, remark text" {
		t.Errorf("history columns: %s", types)
	}
	var dead int
	_ = st.tpool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_dead_letters`).Scan(&dead)
	if dead != 0 {
		t.Errorf("%d dead letters", dead)
	}
	t.Logf("evo_history equals the source's audit log over 5 schema changes: %d versions", len(want))
}
