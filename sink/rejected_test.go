package sink_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// A value PostgreSQL rejects (SQLSTATE class 22 or 23) costs exactly the
// event that carries it: it goes to the dead-letter table with the
// database's message, and the rest of the batch, the same key's other
// events included, is applied.
func TestRejectedValuesAreDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	// A pre-created table narrower than the events: its types and
	// constraints are respected.
	if _, err := pool.Exec(ctx, `CREATE TABLE customers_history (customer_id text NOT NULL, name text NOT NULL,
		plan varchar(5), city text CHECK (city <> 'Nowhere'), visits bigint)`); err != nil {
		t.Fatal(err)
	}
	s := newSink(t, pool, "public", custSpec("public"))
	day := date(3, 1)
	evs := []*change.Event{
		cust(change.OpRead, 1, day, "A", "name", "Ann", "plan", "basic", "city", "Wien", "visits", 1),
		cust(change.OpRead, 2, day, "B", "name", "Bob", "plan", "enterprise", "city", "Linz", "visits", 1), // 22001: too long
		cust(change.OpRead, 3, day, "C", "name", "Cid", "plan", "pro", "city", "Graz", "visits", 1),
		cust(change.OpUpdate, 4, day.Add(1), "C", "name", "Cid", "plan", "pro", "city", "Nowhere", "visits", 1), // 23514: check
		cust(change.OpUpdate, 5, day.Add(2), "C", "name", "Cid", "plan", "team", "city", "Graz", "visits", 2),
		cust(change.OpRead, 6, day, "D", "name", nil, "plan", "pro", "city", "Wels", "visits", 1), // 23502: not null
		cust(change.OpRead, 7, day, "E", "name", "Eve", "plan", "pro", "city", "Enns", "visits", 1),
	}
	res, err := s.Apply(ctx, sink.Batch{Events: evs, Positions: sink.At(map[change.Partition]int64{{Topic: "shop.public.customers"}: 8})})
	if err != nil {
		t.Fatalf("one bad value stopped the batch: %v", err)
	}
	if res.DeadLetters != 3 {
		t.Errorf("%d dead letters, want 3", res.DeadLetters)
	}
	rows, err := pool.Query(ctx, `SELECT "offset", error FROM scd2sink_dead_letters ORDER BY "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]string{2: "22001", 4: "23514", 6: "23502"}
	n := 0
	for rows.Next() {
		var off int64
		var msg string
		if err := rows.Scan(&off, &msg); err != nil {
			t.Fatal(err)
		}
		n++
		if code, ok := want[off]; !ok || !strings.Contains(msg, code) || !strings.Contains(msg, "rejected by PostgreSQL") {
			t.Errorf("dead letter at offset %d: %s", off, msg)
		}
	}
	if n != 3 {
		t.Errorf("%d dead-letter rows, want 3", n)
	}
	var got string
	if err := pool.QueryRow(ctx, `SELECT string_agg(customer_id || ':' || plan || ':' || visits || ':' || is_current, ' ' ORDER BY customer_id, scd_seq)
		FROM customers_history`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "A:basic:1:true C:pro:2:false C:team:2:true E:pro:1:true"; got != want {
		t.Errorf("history %q, want %q", got, want)
	}
	offs, err := s.Offsets(ctx)
	if err != nil || offs[change.Partition{Topic: "shop.public.customers"}] != 8 {
		t.Errorf("offsets %v, %v: the batch's offsets must be recorded", offs, err)
	}
	verifyClean(t, s, "customers_history")
	// The next batch goes through the fast path again.
	apply(t, s, cust(change.OpUpdate, 9, day.Add(3), "A", "name", "Ann", "plan", "pro", "city", "Wien", "visits", 3))
}

// Keys whose only event in a batch carries a rejected value (the usual case
// in steady streaming) cost that event alone, in every batch shape; the
// history equals the fold of the accepted events. The table is pre-created
// with city varchar(6), as an operator's narrower table would be.
func TestRejectedSingleEventKeys(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	cities := []string{"Wien", "Innsbruck", "Linz", "Salzburg", "Graz", "Klagenfurt", "Enns"}
	var evs, good []*change.Event
	seq := int64(1)
	for k := 0; k < 6; k++ {
		for i := 0; i < 4; i++ {
			op := change.OpUpdate
			if i == 0 {
				op = change.OpCreate
			}
			city := cities[(k+i*3)%len(cities)]
			ev := cust(op, seq, date(1, 1).Add(time.Duration(seq)*time.Hour), fmt.Sprintf("K%d", k),
				"name", "n", "plan", "basic", "city", city, "visits", i)
			seq++
			evs = append(evs, ev)
			if len(city) <= 6 {
				good = append(good, ev)
			}
		}
	}
	byKey := func() [][]*change.Event { // one batch per event, key by key
		var out [][]*change.Event
		for _, e := range evs {
			out = append(out, []*change.Event{e})
		}
		return out
	}
	shapes := []struct {
		name    string
		batches func() [][]*change.Event
	}{
		{"one event per batch", byKey},
		{"many keys one event each", func() [][]*change.Event {
			var out [][]*change.Event
			for i := 0; i < 4; i++ { // the i-th event of every key together
				var b []*change.Event
				for k := 0; k < 6; k++ {
					b = append(b, evs[k*4+i])
				}
				out = append(out, b)
			}
			return out
		}},
		{"everything at once", func() [][]*change.Event { return [][]*change.Event{evs} }},
		{"mixed and late", func() [][]*change.Event {
			rng := rand.New(rand.NewPCG(7, 7))
			perm := rng.Perm(len(evs))
			var out [][]*change.Event
			for len(perm) > 0 {
				n := min(1+rng.IntN(5), len(perm))
				var b []*change.Event
				for _, i := range perm[:n] {
					b = append(b, evs[i])
				}
				out, perm = append(out, b), perm[n:]
			}
			return out
		}},
	}
	for i, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			ctx := context.Background()
			schema := fmt.Sprintf("rejsingle%d", i)
			if _, err := pool.Exec(ctx, fmt.Sprintf(`DROP SCHEMA IF EXISTS %[1]s CASCADE; CREATE SCHEMA %[1]s;
				CREATE TABLE %[1]s.customers_history (customer_id text NOT NULL, name text, plan text, city varchar(6), visits bigint)`, schema)); err != nil {
				t.Fatal(err)
			}
			spec := custSpec(schema)
			s := newSink(t, pool, schema, spec)
			for j, b := range sh.batches() {
				if _, err := s.Apply(ctx, sink.Batch{Events: b, Positions: sink.At(map[change.Partition]int64{{Topic: "shop.public.customers"}: int64(j + 1)})}); err != nil {
					t.Fatalf("batch %d: %v", j, err)
				}
			}
			want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, good))
			if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
				t.Errorf("history differs from the fold of the accepted events:\n%s", d)
			}
			var dead int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".scd2sink_dead_letters WHERE error LIKE '%22001%'").Scan(&dead); err != nil {
				t.Fatal(err)
			}
			if want := len(evs) - len(good); dead != want {
				t.Errorf("%d dead letters, want %d", dead, want)
			}
			verifyClean(t, s, "customers_history")
		})
	}
}
