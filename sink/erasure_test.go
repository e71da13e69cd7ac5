package sink_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestErase: an erased key leaves no version, side row, repair audit or
// dead letter; its events applied again (a rebuild, a replay) are dropped
// and counted by every writer, also one started later; the record holds no
// trace of the key; a writer without the secret, or with another, stops;
// a lift lets the key back. The other keys keep the fold's history.
func TestErase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	spec := custSpec("public")
	secret := []byte("0123456789abcdef0123456789abcdef")
	cfg := sink.Config{Schema: "public", Tables: []sink.TableSpec{spec}, ErasureSecret: secret}
	s := newSinkWith(t, pool, cfg)
	c1 := []*change.Event{
		cust(change.OpCreate, 1, day, "C1", "name", "Ann", "plan", "basic", "city", "Wien", "visits", 1),
		cust(change.OpUpdate, 3, day.AddDate(0, 0, 2), "C1", "name", "Ann", "plan", "pro", "city", "Wien", "visits", 2),
		cust(change.OpUpdate, 4, day.AddDate(0, 0, 3), "C1", "name", "Ann", "plan", "pro", "city", "Wien", "visits", 3),
	}
	late := cust(change.OpUpdate, 2, day.AddDate(0, 0, 1), "C1", "name", "Ann", "plan", "team", "city", "Wien", "visits", 1)
	bad := cust(change.OpUpdate, 5, day.AddDate(0, 0, 4), "C1", "name", "Ann", "plan", "pro", "city", "Wien", "visits", "many")
	c2 := []*change.Event{
		cust(change.OpCreate, 11, day, "C2", "name", "Bob", "plan", "basic", "city", "Graz", "visits", 1),
		cust(change.OpUpdate, 12, day.AddDate(0, 0, 1), "C2", "name", "Bob", "plan", "pro", "city", "Graz", "visits", 1),
	}
	apply(t, s, append(append([]*change.Event(nil), c1...), c2...)...)
	if r := apply(t, s, late, bad); r.Repaired != 1 || r.DeadLetters != 1 {
		t.Fatalf("setup: repaired %d, dead letters %d; want 1 and 1", r.Repaired, r.DeadLetters)
	}
	count := func(q string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	traces := func() [4]int {
		return [4]int{count(`SELECT count(*) FROM customers_history WHERE customer_id = 'C1'`),
			count(`SELECT count(*) FROM customers_history_scd_events WHERE customer_id = 'C1'`),
			count(`SELECT count(*) FROM customers_history_scd_repairs WHERE key->>'customer_id' = 'C1'`),
			count(`SELECT count(*) FROM scd2sink_dead_letters WHERE convert_from(key, 'UTF8') LIKE '%C1%'`)}
	}
	if tr := traces(); tr[0] == 0 || tr[1] == 0 || tr[2] == 0 || tr[3] == 0 {
		t.Fatalf("setup: traces of C1 %v, want some of each", tr)
	}
	res, err := s.Erase(ctx, sink.EraseRequest{Target: spec.Target, Keys: [][]string{{"C1"}}, Reason: "GDPR request 42"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Keys) != 1 || res.Keys[0].Versions == 0 || res.Keys[0].DeadLetters != 1 || res.Keys[0].Repairs == 0 {
		t.Fatalf("erase result %+v", res)
	}
	if tr := traces(); tr != [4]int{} {
		t.Fatalf("after erase: traces of C1 %v (versions, side rows, repairs, dead letters), want none", tr)
	}
	if n := count(`SELECT count(*) FROM scd2sink_erasures e WHERE e::text LIKE '%C1%'`); n != 0 {
		t.Fatalf("scd2sink_erasures holds the key itself")
	}
	if n := count(`SELECT count(*) FROM scd2sink_erasures WHERE reason = 'GDPR request 42' AND action = 'erase' AND length(key_hash) = 64`); n != 1 {
		t.Fatalf("scd2sink_erasures: %d rows of the erasure", n)
	}

	// Everything applied again, by this writer and by a new one: C1 stays
	// out, counted.
	again := append(append(append([]*change.Event(nil), c1...), late, bad), c2...)
	for name, w := range map[string]*sink.Sink{"same writer": s, "new writer": newSinkWith(t, pool, cfg)} {
		r := apply(t, w, again...)
		if r.Erased[spec.Target] != 5 {
			t.Errorf("%s: erased events dropped %v, want 5", name, r.Erased)
		}
		if tr := traces(); tr != [4]int{} {
			t.Fatalf("%s: C1 came back: %v", name, tr)
		}
	}
	want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, c2))
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
		t.Fatalf("history differs from the fold of C2:\n%s", d)
	}
	verifyClean(t, s, spec.Target)

	for name, sec := range map[string][]byte{"no secret": nil, "another secret": []byte("another secret, just as long as it")} {
		c := cfg
		c.ErasureSecret = sec
		w, err := sink.New(c, pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Init(ctx); !errors.Is(err, sink.ErrErasureKey) {
			t.Errorf("%s: Init: %v, want ErrErasureKey", name, err)
		}
	}

	if _, err := s.Erase(ctx, sink.EraseRequest{Target: spec.Target, Keys: [][]string{{"C1"}}, Lift: true}); err != nil {
		t.Fatal(err)
	}
	r := apply(t, s, c1...)
	if r.Erased[spec.Target] != 0 || count(`SELECT count(*) FROM customers_history WHERE customer_id = 'C1'`) == 0 {
		t.Fatalf("after lift: %v dropped, C1 not back", r.Erased)
	}

	if _, err := s.Erase(ctx, sink.EraseRequest{Target: spec.Target, Keys: [][]string{{"C1", "x"}}}); err == nil || !strings.Contains(err.Error(), "key has 2 values") {
		t.Errorf("a key with two values: %v", err)
	}
}

// TestEraseOutsideServiceSchema: a target whose history lives in another
// schema than the service's tables is erased (its history read and
// deleted in its schema, the outside write counted in the service's);
// a key of the wrong length is refused before any table is created.
func TestEraseOutsideServiceSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA hist`); err != nil {
		t.Fatal(err)
	}
	spec := custSpec("hist")
	later := sink.TableSpec{Target: "orders_history", Schema: "public", Keys: []string{"order_id"}}
	cfg := sink.Config{Schema: "public", Tables: []sink.TableSpec{spec, later}, ErasureSecret: []byte("0123456789abcdef0123456789abcdef")}
	s := newSinkWith(t, pool, cfg)
	apply(t, s, cust(change.OpCreate, 1, day, "C1", "name", "Ann", "plan", "basic", "city", "Wien", "visits", 1),
		cust(change.OpCreate, 2, day, "C2", "name", "Bob", "plan", "basic", "city", "Graz", "visits", 1))
	count := func(q string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	outside := count(`SELECT coalesce(sum(n), 0) FROM public.scd2sink_outside_writes`)
	if _, err := s.Erase(ctx, sink.EraseRequest{Target: spec.Target, Keys: [][]string{{"C1"}}}); err != nil {
		t.Fatalf("erase of a target in another schema: %v", err)
	}
	if n := count(`SELECT count(*) FROM hist.customers_history WHERE customer_id = 'C1'`); n != 0 {
		t.Errorf("C1 has %d versions after its erase, want 0", n)
	}
	if n := count(`SELECT count(*) FROM hist.customers_history WHERE customer_id = 'C2'`); n != 1 {
		t.Errorf("C2 has %d versions, want 1", n)
	}
	if n := count(`SELECT coalesce(sum(n), 0) FROM public.scd2sink_outside_writes`); n <= outside {
		t.Errorf("outside writes %d after the erase, %d before: not counted in the service schema", n, outside)
	}
	_, err := s.Erase(ctx, sink.EraseRequest{Target: later.Target, Keys: [][]string{{"1", "2"}}})
	if err == nil || !strings.Contains(err.Error(), "key has 2 values") {
		t.Fatalf("erase with a key of 2 values for a 1-column key: %v, want refused", err)
	}
	if n := count(`SELECT count(*) FROM pg_class WHERE relname = 'orders_history'`); n != 0 {
		t.Errorf("a refused erase created %d tables, want none", n)
	}
}
