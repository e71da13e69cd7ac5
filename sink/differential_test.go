package sink_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestPartialRepairDifferential: long histories of few keys (tracked and
// Type 1 changes, deletes and re-creates, times that go backwards),
// delivered in random order with duplicates, applied three times: with
// repairs reading from the version before a late event up to a boundary
// version the late events cannot move (on to the end when the fold shows
// they do), with repairs reading from there to the end, and with repairs
// reading the whole history. The history tables, side tables and repair audits are
// the same, and equal to the fold, for every Type 1 scope and delete mode.
func TestPartialRepairDifferential(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	seeds := propertySeeds(t) / 8
	var bounded int64
	t.Cleanup(func() {
		// The partial repairs stopped at a boundary now and then: the
		// comparison covers that path.
		if n := bounded; n == 0 && !t.Failed() {
			t.Error("no repair stopped at a boundary")
		} else {
			t.Logf("%d repairs stopped at a boundary", n)
		}
	})
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		for _, scope := range []sink.Type1Scope{sink.AllVersions, sink.CurrentVersion} {
			for _, del := range []sink.DeletesMode{sink.DeletesClose, sink.DeletesIgnore} {
				t.Run(fmt.Sprintf("seed%d/%s/%s", seed, scope, del), func(t *testing.T) {
					bounded += differential(t, pool, seed, scope, del)
				})
			}
		}
	}
}

func longHistory(rng *rand.Rand) []*change.Event {
	var evs []*change.Event
	seq := int64(100)
	at := day
	plans, cities, names := []string{"basic", "pro", "team"}, []string{"Wien", "Linz"}, []string{"Ann", "Bo", "Cy"}
	for k := 0; k < 2; k++ {
		id := fmt.Sprintf("K%d", k)
		row := map[string]string{"name": "Ann", "plan": "basic", "city": "Wien"}
		visits := 0
		alive := false
		for i := 0; i < 40+rng.IntN(40); i++ {
			seq += int64(1 + rng.IntN(3))
			if rng.IntN(6) == 0 {
				at = at.Add(-time.Duration(rng.IntN(90)) * time.Minute) // a time that goes backwards
			} else {
				at = at.Add(time.Duration(rng.IntN(120)) * time.Minute)
			}
			op := change.OpUpdate
			switch r := rng.IntN(20); {
			case !alive:
				op = change.OpCreate
			case r == 0:
				op = change.OpDelete
			case r < 11:
				row["plan"], row["city"] = plans[rng.IntN(3)], cities[rng.IntN(2)]
			case r < 18:
				row["name"], visits = names[rng.IntN(3)], visits+1
			}
			alive = op != change.OpDelete
			if op == change.OpDelete {
				evs = append(evs, cust(op, seq, at, id))
				continue
			}
			evs = append(evs, cust(op, seq, at, id, "name", row["name"], "plan", row["plan"], "city", row["city"], "visits", visits))
		}
	}
	return evs
}

// differential compares the three ways for one seed, scope and delete
// mode and returns how many repairs stopped at a boundary.
func differential(t *testing.T, pool *pgxpool.Pool, seed uint64, scope sink.Type1Scope, del sink.DeletesMode) (bounded int64) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0xd1ff))
	evs := longHistory(rng)
	batches := deliver(rng, evs)
	modes := []struct {
		name             string
		whole, unbounded bool
	}{{"bounded", false, false}, {"unbounded", false, true}, {"whole", true, false}}
	var lines [3][]string
	var side, audit [3]string
	// One schema for the three ways, emptied between them: the tables
	// are made once (their DDL is much of this test's time).
	schema := fmt.Sprintf("diff%d_%s_%s", seed, scope[:3], del)
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	for i, mode := range modes {
		if i > 0 {
			emptySchema(t, pool, schema)
		}
		spec := custSpec(schema)
		spec.Type1Scope, spec.Deletes = scope, del
		s := newSink(t, pool, schema, spec)
		s.Tune(func(tu *sink.Tuning) { tu.Apply.WholeRepairs, tu.Apply.UnboundedRepairs = mode.whole, mode.unbounded })
		for j, b := range batches {
			if _, err := s.Apply(ctx, sink.Batch{Events: b}); err != nil {
				t.Fatalf("batch %d: %v", j, err)
			}
		}
		bounded += s.BoundedRepairs()
		lines[i] = scdtest.HistoryLines(t, pool, spec, custCols)
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(string_agg(format('%%s %%s %%s %%s %%s %%s %%s', customer_id, encode(scd_seq, 'hex'), scd_op, scd_t, scd_raw_t, name, plan), E'\n' ORDER BY customer_id, scd_seq), '')
			FROM %s.customers_history_scd_events`, schema)).Scan(&side[i]); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(string_agg(format('%%s %%s %%s %%s %%s', key, encode(cause_seq, 'hex'), before, after, omitted), E'\n' ORDER BY id), '')
			FROM %s.customers_history_scd_repairs`, schema)).Scan(&audit[i]); err != nil {
			t.Fatal(err)
		}
		want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, evs))
		if d := scdtest.DiffLines(want, lines[i]); d != "" {
			t.Fatalf("%s repairs: history differs from the fold:\n%s", mode.name, d)
		}
		verifyClean(t, s, spec.Target)
	}
	for i := range 2 {
		if side[i] != side[2] {
			t.Errorf("side tables differ:\n%s:\n%s\nwhole:\n%s", modes[i].name, side[i], side[2])
		}
		if audit[i] != audit[2] {
			t.Errorf("repair audits differ:\n%s:\n%s\nwhole:\n%s", modes[i].name, audit[i], audit[2])
		}
	}
	return bounded
}
