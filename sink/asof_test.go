package sink_test

import (
	"context"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// TestAsOf: <target>_as_of(at) returns exactly the versions valid at at,
// the interval's start included and its end excluded, and follows columns
// added later.
func TestAsOf(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	s := newSink(t, pool, "public", custSpec("public"))
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	apply(t, s,
		cust(change.OpCreate, 1, h(1), "A", "name", "Ann", "plan", "basic"),
		cust(change.OpUpdate, 2, h(3), "A", "name", "Ann", "plan", "pro"),
		cust(change.OpCreate, 3, h(2), "B", "name", "Bob", "plan", "basic"),
		cust(change.OpDelete, 4, h(4), "B"),
	)
	tests := []struct {
		at   time.Time
		want string // customer:plan of the versions valid at at, by key
	}{
		{h(0), ""},
		{h(1), "A:basic"},
		{h(2), "A:basic B:basic"},
		{h(3), "A:pro B:basic"}, // A's first version ends at h(3): excluded
		{h(4), "A:pro"},         // B deleted at h(4)
		{h(100), "A:pro"},
	}
	for _, tc := range tests {
		t.Run(tc.at.Format(time.TimeOnly), func(t *testing.T) {
			var got string
			err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(customer_id || ':' || plan, ' ' ORDER BY customer_id), '')
				FROM customers_history_as_of($1)`, tc.at).Scan(&got)
			if err != nil || got != tc.want {
				t.Fatalf("as of %s: %q (%v), want %q", tc.at, got, err, tc.want)
			}
			var plain string
			if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(customer_id || ':' || plan, ' ' ORDER BY customer_id), '')
				FROM customers_history WHERE valid_from <= $1 AND (valid_to IS NULL OR $1 < valid_to)`, tc.at).Scan(&plain); err != nil || plain != got {
				t.Fatalf("the plain predicate gives %q (%v)", plain, err)
			}
		})
	}
	// A column added later comes through the function.
	apply(t, s, cust(change.OpUpdate, 5, h(5), "A", "name", "Ann", "plan", "pro", "tier", "gold"))
	var tier string
	if err := pool.QueryRow(ctx, `SELECT tier FROM customers_history_as_of($1) WHERE customer_id = 'A'`, h(6)).Scan(&tier); err != nil || tier != "gold" {
		t.Fatalf("tier %q (%v)", tier, err)
	}
}
