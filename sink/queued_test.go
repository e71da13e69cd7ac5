package sink_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestQueuedWritesEqualCopy: real-shaped Debezium JSON (numeric,
// dates, zoned and micro timestamps, jsonb, before images, deletes and
// re-creates) over two tables, delivered in random order with
// redeliveries, applied twice: with small tables' writes queued and sent
// together as INSERTs from arrays (history.Later), and with every
// table's share written at once by COPY. Every column of the history and
// side tables, the bookkeeping included, is the same both ways.
func TestQueuedWritesEqualCopy(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	ctx := context.Background()
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x9e3))
			recs := scdtest.BenchWorkload(rng, 60, 900)
			var rules []debezium.Rule
			for _, src := range []*scdtest.Source{scdtest.BenchCustomers(), scdtest.BenchAccounts()} {
				rules = append(rules, debezium.Rule{Topic: src.Topic(), Target: src.Table + "_history",
					SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"})
			}
			d := debezium.New(rules, nil, nil)
			var evs []*change.Event
			for i, r := range recs {
				if r.Tombstone {
					continue
				}
				k, v := r.Src.Envelope(r.Change)
				o := change.Origin{Partition: change.Partition{Topic: r.Src.Topic()}, Offset: int64(i)}
				ev, err := d.Decode(ctx, o, k, v)
				if err != nil || ev == nil {
					t.Fatalf("record %d: %v", i, err)
				}
				evs = append(evs, ev)
			}
			batches := deliver(rng, evs)
			var dumps [2]string
			for i, unqueued := range []bool{false, true} {
				schema := fmt.Sprintf("queued%d_%t", seed, unqueued)
				var specs []sink.TableSpec
				for _, tbl := range []string{"customers", "accounts"} {
					specs = append(specs, sink.TableSpec{Target: tbl + "_history", Schema: schema, Keys: []string{"id"},
						TrackHistory: scdtest.BenchTracked[tbl]})
				}
				s := newSinkTuned(t, pool, sink.Config{Schema: schema, Tables: specs}, func(tu *sink.Tuning) { tu.Apply.Unqueued = unqueued })
				for j, b := range batches {
					if _, err := s.Apply(ctx, sink.Batch{Events: b}); err != nil {
						t.Fatalf("unqueued %t, batch %d: %v", unqueued, j, err)
					}
				}
				for _, tbl := range []string{"customers_history", "accounts_history", "customers_history_scd_events", "accounts_history_scd_events"} {
					var n int
					var dump string
					if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), coalesce(string_agg((to_jsonb(h) - 'scd_id')::text, E'\n' ORDER BY id, scd_seq, (to_jsonb(h) - 'scd_id')::text), '')
						FROM %s.%s h`, schema, tbl)).Scan(&n, &dump); err != nil {
						t.Fatal(err)
					}
					if n == 0 && (tbl == "customers_history" || tbl == "accounts_history") {
						t.Fatalf("%s.%s is empty", schema, tbl)
					}
					dumps[i] += fmt.Sprintf("%s (%d rows):\n%s\n", tbl, n, dump)
				}
				verifyClean(t, s, "customers_history")
				verifyClean(t, s, "accounts_history")
			}
			if d := scdtest.DiffLines(strings.Split(dumps[1], "\n"), strings.Split(dumps[0], "\n")); d != "" {
				t.Fatalf("queued writes differ from those written at once (want: at once, got: queued):\n%s", d)
			}
		})
	}
}

// TestQueuedWritesOfHandMadeTypes: a history table whose columns an
// operator changed to types pgx has no codec for (an enum, citext, a
// domain) and to blank-padded strings (char(n), the key too), written
// queued and at once: the same rows, equal to the fold; no value cut to
// one character, no key with two current versions.
func TestQueuedWritesOfHandMadeTypes(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 0xc4a7))
	var evs []*change.Event
	seq := int64(100)
	at := day
	plans, cities, names := []string{"basic", "proXY", "teams"}, []string{"Wien", "Linz"}, []string{"Ann", "bo", "CY"}
	for k := range 4 {
		id := fmt.Sprintf("K%03d", k)
		alive := false
		for range 30 {
			seq += int64(1 + rng.IntN(3))
			at = at.Add(time.Duration(1+rng.IntN(90)) * time.Minute)
			op := change.OpUpdate
			switch {
			case !alive:
				op = change.OpCreate
			case rng.IntN(12) == 0:
				op = change.OpDelete
			}
			alive = op != change.OpDelete
			if op == change.OpDelete {
				evs = append(evs, cust(op, seq, at, id))
				continue
			}
			evs = append(evs, cust(op, seq, at, id, "name", names[rng.IntN(3)], "plan", plans[rng.IntN(3)], "city", cities[rng.IntN(2)], "visits", rng.IntN(5)))
		}
	}
	first, rest := evs[:4], evs[4:]
	batches := deliver(rng, rest)
	var dumps [2][]string
	for i, unqueued := range []bool{false, true} {
		schema := fmt.Sprintf("handtypes_%t", unqueued)
		spec := custSpec(schema)
		s := newSink(t, pool, schema, spec)
		if _, err := s.Apply(ctx, sink.Batch{Events: first}); err != nil {
			t.Fatal(err)
		}
		// What an operator may do to the tables the sink made.
		if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE EXTENSION IF NOT EXISTS citext;
			CREATE TYPE %[1]s.town AS ENUM ('Linz', 'Wien');
			CREATE DOMAIN %[1]s.count AS bigint CHECK (VALUE >= 0);`, schema)); err != nil {
			t.Fatal(err)
		}
		// Its views go first (they name the columns; the sink makes them
		// again at its start).
		var views []string
		if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(c.oid::regclass::text), '{}') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relkind = 'v'`, schema).Scan(&views); err != nil {
			t.Fatal(err)
		}
		for _, v := range views {
			if _, err := pool.Exec(ctx, "DROP VIEW IF EXISTS "+v+" CASCADE"); err != nil {
				t.Fatal(err)
			}
		}
		for _, tbl := range []string{"customers_history", "customers_history_scd_events"} {
			if _, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE %[1]s.%[2]s ALTER customer_id TYPE char(4), ALTER plan TYPE char(5),
				ALTER city TYPE %[1]s.town USING city::%[1]s.town, ALTER name TYPE citext, ALTER visits TYPE %[1]s.count`, schema, tbl)); err != nil {
				t.Fatal(err)
			}
		}
		s = newSinkTuned(t, pool, sink.Config{Schema: schema, Tables: []sink.TableSpec{spec}}, func(tu *sink.Tuning) { tu.Apply.Unqueued = unqueued })
		for j, b := range batches {
			if _, err := s.Apply(ctx, sink.Batch{Events: b}); err != nil {
				t.Fatalf("unqueued %t, batch %d: %v", unqueued, j, err)
			}
		}
		got := scdtest.HistoryLines(t, pool, spec, custCols)
		if d := scdtest.DiffLines(scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, evs)), got); d != "" {
			t.Fatalf("unqueued %t: history differs from the fold:\n%s", unqueued, d)
		}
		var twice, short int
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM (SELECT customer_id FROM %[1]s.customers_history WHERE is_current
			GROUP BY 1 HAVING count(*) > 1) k), (SELECT count(*) FROM %[1]s.customers_history WHERE length(plan) < 5 OR length(customer_id) < 4)`, schema)).Scan(&twice, &short); err != nil {
			t.Fatal(err)
		}
		if twice != 0 || short != 0 {
			t.Fatalf("unqueued %t: %d keys with two current versions, %d rows with a cut value", unqueued, twice, short)
		}
		dumps[i] = got
	}
	if d := scdtest.DiffLines(dumps[1], dumps[0]); d != "" {
		t.Fatalf("queued writes differ from those written at once:\n%s", d)
	}
}

// TestQueuedFailureIsItsTables: a queued write that PostgreSQL refuses
// (here a trigger on one history table) fails as its own table's, also
// when another table's step sends the queue (the second pass of a
// primary-key change reads its table), so that the right table is parked.
func TestQueuedFailureIsItsTables(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	ctx := context.Background()
	acct := func(op change.Op, seq int64, at time.Time, id string, kv ...any) *change.Event {
		ev := cust(op, seq, at, id, kv...)
		ev.Table, ev.Origin.Topic = "accounts_history", "shop.public.accounts"
		return ev
	}
	for _, keyChange := range []bool{false, true} {
		t.Run(fmt.Sprintf("key change %t", keyChange), func(t *testing.T) {
			schema := fmt.Sprintf("queuedfail_%t", keyChange)
			customers, accounts := custSpec(schema), custSpec(schema)
			accounts.Target = "accounts_history"
			s := newSink(t, pool, schema, customers, accounts)
			if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{
				cust(change.OpCreate, 10, day, "C1", "name", "Ann", "plan", "basic", "city", "Wien", "visits", 1),
				acct(change.OpCreate, 10, day, "A1", "name", "Bo", "plan", "basic", "city", "Linz", "visits", 1),
			}}); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %[1]s.refuse() RETURNS trigger LANGUAGE plpgsql AS
				$$ BEGIN RAISE EXCEPTION 'not now' USING ERRCODE = '42501'; END $$;
				CREATE TRIGGER refuse BEFORE INSERT ON %[1]s.accounts_history FOR EACH ROW EXECUTE FUNCTION %[1]s.refuse()`, schema)); err != nil {
				t.Fatal(err)
			}
			evs := []*change.Event{
				acct(change.OpUpdate, 20, day.Add(time.Hour), "A1", "name", "Bo", "plan", "pro", "city", "Linz", "visits", 2),
				cust(change.OpUpdate, 20, day.Add(time.Hour), "C1", "name", "Ann", "plan", "pro", "city", "Wien", "visits", 2),
			}
			if keyChange {
				del := cust(change.OpDelete, 30, day.Add(2*time.Hour), "C1")
				del.KeyChanged = true
				create := cust(change.OpCreate, 30, day.Add(2*time.Hour), "C9", "name", change.Unavailable, "plan", "pro", "city", "Graz", "visits", 2)
				create.OldKey = []any{"C1"}
				evs = append(evs, del, create)
			}
			_, err := s.Apply(ctx, sink.Batch{Events: evs})
			var te *sink.TargetError
			if !errors.As(err, &te) || te.Target != "accounts_history" {
				t.Fatalf("error %v, want accounts_history's", err)
			}
		})
	}
}
