package sink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/retry"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

func TestVerifyReportsCorruption(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	s := newSink(t, pool, "public", spec)
	apply(t, s, seedEvents()...)
	verifyClean(t, s, spec.Target)
	cases := []struct {
		name, check, key string
		sql              []string
	}{
		{"two current versions", "more than one current version", `["C1001"]`,
			[]string{`UPDATE customers_history SET valid_to = NULL, is_current = true WHERE customer_id = 'C1001'`}},
		{"overlapping intervals", "overlapping versions", `["C1002"]`,
			[]string{`UPDATE customers_history SET valid_to = '2026-03-15' WHERE customer_id = 'C1002' AND NOT is_current`}},
		{"is_current with valid_to", "is_current disagrees with valid_to", `["C1003"]`,
			[]string{`UPDATE customers_history SET valid_to = '2027-01-01' WHERE customer_id = 'C1003'`}},
		{"valid_from after valid_to", "valid_from after valid_to", `["C1001"]`,
			[]string{`UPDATE customers_history SET valid_to = '2025-01-01' WHERE customer_id = 'C1001' AND NOT is_current`}},
		{"duplicate key and sequence", "duplicate (key, scd_seq)", `["C1004"]`,
			[]string{`DROP INDEX customers_history_scd_key_seq`,
				`INSERT INTO customers_history (customer_id, name, plan, city, visits, valid_from, valid_to, is_current, scd_seq, scd_op, scd_hash)
				 SELECT customer_id, name, plan, city, visits, valid_from - interval '1 day', valid_from - interval '1 hour', false, scd_seq, scd_op, scd_hash
				 FROM customers_history WHERE customer_id = 'C1004'`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			for _, q := range c.sql {
				if _, err := tx.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			// Verify reads through the pool: commit the corruption, undo it after.
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if _, err := pool.Exec(ctx, "DROP TABLE customers_history CASCADE; DROP TABLE customers_history_scd_events"); err != nil {
					t.Fatal(err)
				}
				s = newSink(t, pool, "public", spec)
				apply(t, s, seedEvents()...)
			})
			vs, err := s.Verify(ctx, spec.Target)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, v := range vs {
				found = found || (v.Check == c.check && v.Key == c.key)
			}
			if !found {
				t.Fatalf("Verify did not report %q for %s; got %v", c.check, c.key, vs)
			}
		})
	}
}

// TestVerifyListsAtMostAThousand: a table broken on every key gives
// MaxViolationsListed violations of the check and one that counts the
// rest, not one per key (verify's memory does not grow with the table).
func TestVerifyListsAtMostAThousand(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	s := newSink(t, pool, "public", spec)
	const keys = sink.MaxViolationsListed + 5
	var evs []*change.Event
	for k := range keys {
		evs = append(evs, cust(change.OpCreate, int64(k+1), day, fmt.Sprintf("K%d", k), "name", "a", "plan", "basic"))
	}
	apply(t, s, evs...)
	if _, err := pool.Exec(ctx, `UPDATE customers_history SET valid_to = '2027-01-01'`); err != nil {
		t.Fatal(err)
	}
	vs, err := s.Verify(ctx, spec.Target)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != sink.MaxViolationsListed+1 {
		t.Fatalf("%d violations listed, want %d and one that counts the rest", len(vs), sink.MaxViolationsListed+1)
	}
	if last := vs[len(vs)-1]; last.Check != "is_current disagrees with valid_to" || !strings.HasPrefix(last.Info, "5 more violations") || last.More != 5 {
		t.Fatalf("last violation %v, want the count of the 5 not listed", last)
	}
}

func TestDeadLettersAndOffsets(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	s := newSink(t, pool, "public", spec)
	good := cust(change.OpCreate, 1, day, "C1", "name", "a", "plan", "p", "city", "x", "visits", 1)
	noSeq := cust(change.OpCreate, 2, day, "C2", "name", "a")
	noSeq.Seq = nil
	noKey := cust(change.OpCreate, 3, day, "C3", "name", "a")
	noKey.Key = []any{nil}
	badOp := cust(change.OpUpdate, 4, day, "C4", "name", "a")
	badOp.Op = 'x'
	badValue := cust(change.OpCreate, 5, day, "C5", "name", "a", "visits", "many")
	noTable := cust(change.OpCreate, 6, day, "C6", "name", "a")
	noTable.Table = "nope"
	conflict := cust(change.OpCreate, 1, day, "C1", "name", "other", "plan", "p", "city", "x", "visits", 1)
	p := change.Partition{Topic: "shop.public.customers", Partition: 3}
	res, err := s.Apply(ctx, sink.Batch{
		Events: []*change.Event{good, noSeq, noKey, badOp, badValue, noTable},
		DeadLetters: []sink.DeadLetter{{Origin: change.Origin{Partition: p, Offset: 7}, Key: []byte("k"),
			Value: []byte{0xff, 0x00, 0xfe}, Err: "malformed JSON"}},
		Positions: sink.At(map[change.Partition]int64{p: 8}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.DeadLetters != 6 || res.Events != 1 {
		t.Fatalf("result %+v, want 6 dead letters and 1 event", res)
	}
	res, err = s.Apply(ctx, sink.Batch{Events: []*change.Event{conflict}, Positions: sink.At(map[change.Partition]int64{p: 9})})
	if err != nil || res.DeadLetters != 1 {
		t.Fatalf("conflict: %+v %v", res, err)
	}
	rows, err := pool.Query(ctx, `SELECT coalesce(topic, ''), coalesce(target, ''), error FROM scd2sink_dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var errs []string
	for rows.Next() {
		var topic, target, e string
		if err := rows.Scan(&topic, &target, &e); err != nil {
			t.Fatal(err)
		}
		errs = append(errs, e)
	}
	want := []string{"malformed JSON", "no sequence", "key column customer_id is null", "unknown operation",
		"column visits", "no table is configured", "conflict"}
	if len(errs) != len(want) {
		t.Fatalf("dead letters %q", errs)
	}
	for i, w := range want {
		if !strings.Contains(errs[i], w) {
			t.Errorf("dead letter %d is %q, want it to mention %q", i, errs[i], w)
		}
	}
	offs, err := s.Offsets(ctx)
	if err != nil || offs[p] != 9 {
		t.Fatalf("offsets %v %v, want %s at 9", offs, err, p)
	}
	if got := scdtest.HistoryLines(t, pool, spec, custCols); len(got) != 1 || !strings.Contains(got[0], "name=a ") {
		t.Fatalf("history %v", got)
	}
}

// TestRetriesLostConnections kills the sink's PostgreSQL backends while
// batches are applied; retried as the consumer retries them (the one
// loop of internal/retry, on Classify), every batch lands exactly once:
// a transaction cut anywhere leaves nothing of itself behind.
func TestRetriesLostConnections(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	s, err := sink.New(sink.Config{Schema: "public", Tables: []sink.TableSpec{spec}}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	var evs []*change.Event
	for i := 0; i < 3000; i++ {
		id := "C" + itoa(i%300)
		evs = append(evs, cust(change.OpUpdate, int64(i+1), day.Add(time.Duration(i)*time.Minute), id,
			"name", "n", "plan", "p"+itoa(i%7), "city", "x", "visits", i))
	}
	var killed atomic.Int64
	done, stopped := make(chan struct{}), make(chan struct{})
	stop := func() { close(done); <-stopped }
	go func() {
		defer close(stopped)
		admin := openPool(t, pool.Config().ConnString())
		for {
			select {
			case <-done:
				return
			// A random pause: at a fixed 15 ms a slow machine's batch
			// transaction (longer than that) would never get through.
			case <-time.After(time.Duration(15+rand.IntN(65)) * time.Millisecond):
			}
			var n int64
			_ = admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'`).Scan(&n)
			killed.Add(n)
		}
	}()
	retries := 0
	// Backends die every 15-80 ms: up to 100 retries, 100 ms apart at most.
	policy := retry.Policy{Classify: sink.Classify, Tries: 100, Backoff: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	// Re-applying changes nothing, so rounds repeat until the killer has
	// hit an apply (bounded: a fast machine may finish a round unharmed).
	for round := 0; round < 20 && (round == 0 || retries == 0); round++ {
		for i := 0; i < len(evs); i += 100 {
			n, err := policy.Do(ctx, func(ctx context.Context) error {
				_, err := s.Apply(ctx, sink.Batch{Events: evs[i : i+100]})
				return err
			})
			if err != nil {
				stop()
				t.Fatalf("round %d, batch %d: %v", round, i/100, err)
			}
			retries += n
		}
	}
	stop()
	if killed.Load() == 0 || retries == 0 {
		t.Fatalf("killed %d backends, %d retries: the test did not exercise a failure", killed.Load(), retries)
	}
	want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, evs))
	fresh := openPool(t, pool.Config().ConnString()) // pool may hold connections killed while idle
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, fresh, spec, custCols)); d != "" {
		t.Fatalf("history differs after %d retries:\n%s", retries, d)
	}
	verifyClean(t, s, spec.Target)
}

// TestSchemaEvolutionAndTypes: a table created from schemaless events alone
// gains the columns later events bring, as text; an existing table's column types are kept and
// values are cast into them, compared by value (12.5 = 12.50). The images
// come as maps, and as the raw JSON the Kafka decoder keeps (visited
// member by member, never a map).
func TestSchemaEvolutionAndTypes(t *testing.T) {
	t.Parallel()
	for _, raw := range []bool{false, true} {
		t.Run(fmt.Sprintf("raw JSON %v", raw), func(t *testing.T) { testSchemaEvolutionAndTypes(t, raw) })
	}
}

func testSchemaEvolutionAndTypes(t *testing.T, raw bool) {
	pool := newPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE prices_history (sku varchar(20), price numeric(10,2), seen date,
		valid_from timestamptz NOT NULL, valid_to timestamptz, is_current boolean NOT NULL, scd_seq bytea NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	prices := sink.TableSpec{Target: "prices_history", Keys: []string{"sku"}}
	events := sink.TableSpec{Target: "events_history", Keys: []string{"id"}}
	s := newSink(t, pool, "public", prices, events)
	ev := func(table string, seq int64, key any, after map[string]any) *change.Event {
		e := &change.Event{Table: table, Key: []any{key}, Seq: change.MustSeq(seq), Op: change.OpUpdate,
			ValidFrom: day.Add(time.Duration(seq) * time.Hour), After: after}
		if raw {
			b, err := json.Marshal(after)
			if err != nil {
				t.Fatal(err)
			}
			e.After, e.AfterJSON, e.AfterValid = nil, b, true
		}
		return e
	}
	apply(t, s,
		ev("prices_history", 1, "A", map[string]any{"sku": "A", "price": json.Number("12.5"), "seen": "2026-01-01"}),
		ev("prices_history", 2, "A", map[string]any{"sku": "A", "price": json.Number("12.50"), "seen": "2026-01-01"}),
		ev("events_history", 1, json.Number("7"), map[string]any{"id": json.Number("7"), "kind": "x"}),
	)
	apply(t, s,
		ev("prices_history", 3, "A", map[string]any{"sku": "A", "price": "13.00", "seen": "2026-01-01"}),
		ev("events_history", 2, json.Number("7"), map[string]any{"id": json.Number("7"), "kind": "x", "extra": map[string]any{"a": 1}}),
	)
	var n int
	var typ string
	if err := pool.QueryRow(ctx, `SELECT count(*), min(pg_typeof(price)::text) FROM prices_history`).Scan(&n, &typ); err != nil || n != 2 || typ != "numeric" {
		t.Fatalf("prices_history: %d versions of type %s (%v), want 2 numeric", n, typ, err)
	}
	// Without a schema, new columns are text (DESIGN.md section 4); a
	// nested object keeps its JSON text.
	var extra string
	if err := pool.QueryRow(ctx, `SELECT count(*), min(pg_typeof(extra)::text), min(extra) FROM events_history WHERE extra IS NOT NULL`).Scan(&n, &typ, &extra); err != nil || n != 1 || typ != "text" || extra != `{"a":1}` {
		t.Fatalf("events_history: %d rows with extra of type %s (%v)", n, typ, err)
	}
	for _, target := range []string{"prices_history", "events_history"} {
		verifyClean(t, s, target)
	}
	if _, err := pool.Exec(ctx, `SELECT * FROM prices_history_current, events_history_current`); err != nil {
		t.Fatalf("current views: %v", err)
	}
}

// TestKeysFromEvents: a table that configures no keys takes them from the
// events (the Kafka key's fields), and after a restart from the table.
func TestKeysFromEvents(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	spec := sink.TableSpec{Target: "orders_history"}
	s := newSink(t, pool, "public", spec)
	ev := func(seq int64, status string) *change.Event {
		return &change.Event{Table: "orders_history", Key: []any{json.Number("1"), "A-9"}, KeyNames: []string{"shop", "order_id"},
			Seq: change.MustSeq(seq), Op: change.OpUpdate, ValidFrom: day.Add(time.Duration(seq) * time.Hour),
			After: map[string]any{"shop": json.Number("1"), "order_id": "A-9", "status": status}}
	}
	apply(t, s, ev(1, "new"), ev(2, "paid"))
	s2 := newSink(t, pool, "public", spec)
	apply(t, s2, ev(3, "shipped"))
	withKeys := sink.TableSpec{Target: "orders_history", Schema: "public", Keys: []string{"shop", "order_id"}}
	got := scdtest.HistoryLines(t, pool, withKeys, []string{"status"})
	if len(got) != 3 || !strings.Contains(got[2], "status=shipped") {
		t.Fatalf("history %v", got)
	}
	verifyClean(t, s2, "orders_history")
}

// TestTruncateAlone: a batch holding only a truncate must reach a table the
// (restarted) sink has not touched yet, and a truncate that comes before
// the table exists must still close what arrives late before it.
func TestTruncateAlone(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	spec := sink.TableSpec{Target: "t_history", Keys: []string{"id"}}
	ev := func(id string, seq int64, op change.Op) *change.Event {
		e := &change.Event{Table: "t_history", Seq: change.MustSeq(seq), Op: op, ValidFrom: day.Add(time.Duration(seq) * time.Hour)}
		if op != change.OpTruncate {
			e.Key, e.After = []any{id}, map[string]any{"id": id, "v": "x"}
		}
		return e
	}
	early := newSink(t, pool, "public", spec)
	apply(t, early, ev("", 5, change.OpTruncate)) // no table yet
	apply(t, early, ev("A", 3, change.OpCreate))  // late, before the truncate
	apply(t, early, ev("B", 6, change.OpCreate))
	restarted := newSink(t, pool, "public", spec)
	apply(t, restarted, ev("", 8, change.OpTruncate)) // alone in its batch
	got := scdtest.HistoryLines(t, pool, sink.TableSpec{Target: "t_history", Schema: "public", Keys: []string{"id"}}, []string{"v"})
	want := []string{
		"A seq=200103 [2026-01-01T03:00:00Z, 2026-01-01T05:00:00Z) current=false v=x",
		"B seq=200106 [2026-01-01T06:00:00Z, 2026-01-01T08:00:00Z) current=false v=x",
	}
	if d := scdtest.DiffLines(want, got); d != "" {
		t.Fatalf("history:\n%s", d)
	}
}
