package sink_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// TestDrift: what an operator breaks by hand is named, never a panic.
// verify lists a dropped index, side-table column and view by name; a
// restart's catalog comparison puts them back; a corrupt bookkeeping
// value (an empty scd_op) is a blocked error naming the table.
func TestDrift(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	s := newSink(t, pool, "public", custSpec("public"))
	apply(t, s,
		cust(change.OpCreate, 10, day, "A", "name", "Ann", "plan", "basic", "city", "Wien", "visits", 1),
		cust(change.OpUpdate, 20, day.Add(1), "A", "name", "Ann", "plan", "basic", "city", "Wien", "visits", 2), // Type 1 only: a side row
		cust(change.OpUpdate, 30, day.Add(2), "A", "name", "Ann", "plan", "pro", "city", "Wien", "visits", 2),
	)
	if _, err := pool.Exec(ctx, `DROP INDEX customers_history_scd_key_seq; ALTER TABLE customers_history_scd_events DROP COLUMN city;
		DROP VIEW customers_history_current`); err != nil {
		t.Fatal(err)
	}
	vs, err := s.Verify(ctx, "customers_history")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range vs {
		got = append(got, v.String())
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{"customers_history_scd_key_seq", "column city of customers_history_scd_events", "view customers_history_current"} {
		if !strings.Contains(all, want) {
			t.Errorf("verify does not name %q:\n%s", want, all)
		}
	}
	// A restart compares the catalog and creates what is missing.
	s = newSink(t, pool, "public", custSpec("public"))
	apply(t, s, cust(change.OpUpdate, 40, day.Add(3), "A", "name", "Ann", "plan", "team", "city", "Linz", "visits", 2))
	verifyClean(t, s, "customers_history")
	// Nothing twice: the primary key on scd_id and the key index.
	for i := 0; i < 2; i++ {
		s = newSink(t, pool, "public", custSpec("public"))
		apply(t, s, cust(change.OpUpdate, int64(41+i), day.Add(4), "A", "name", "Ann", "plan", "team", "city", "Linz", "visits", 3+i))
	}
	var indexes int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_index WHERE indrelid = 'customers_history'::regclass`).Scan(&indexes); err != nil || indexes != 2 {
		t.Errorf("%d indexes on the history table after restarts, want 2 (%v)", indexes, err)
	}

	if _, err := pool.Exec(ctx, `UPDATE customers_history_scd_events SET scd_op = ''`); err != nil {
		t.Fatal(err)
	}
	// A late event reads the side rows back (the repair path).
	_, err = s.Apply(ctx, sink.Batch{Events: []*change.Event{
		cust(change.OpUpdate, 25, day.Add(1), "A", "name", "Ann", "plan", "basic", "city", "Graz", "visits", 2)}})
	var drift *sink.DriftError
	if !errors.As(err, &drift) || sink.Classify(err) != sink.Blocked || !strings.Contains(err.Error(), "customers_history_scd_events") {
		t.Fatalf("corrupt scd_op: %v (class %v), want a blocked DriftError naming the side table", err, sink.Classify(err))
	}
}
