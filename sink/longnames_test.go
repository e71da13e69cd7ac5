package sink_test

import (
	"context"
	"strings"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// TestLongColumnNamesThatCollide: PostgreSQL keeps the first 63 bytes of
// a name; two source columns (MySQL allows 64 bytes, SQL Server 128) that
// share them would write one column. The table is created with one column
// for them (no failing DDL), and an event carrying both is a dead letter
// naming them, never a silent overwrite; other tables' events go on.
func TestLongColumnNamesThatCollide(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	prefix := strings.Repeat("customer_preferred_contact_channel_", 2)[:63]
	a, b := prefix+"_email", prefix+"_phone"
	spec := sink.TableSpec{Target: "wide_history", Schema: "public", Keys: []string{"id"}}
	s := newSink(t, pool, "public", spec, custSpec("public"))
	ev := &change.Event{Table: spec.Target, Key: []any{"1"}, Seq: change.MustSeq(10), Op: change.OpCreate, ValidFrom: day,
		Origin: change.Origin{Partition: change.Partition{Topic: "shop.public.wide"}, Offset: 3},
		After:  map[string]any{"id": "1", a: "a@example.com", b: "+43 1 234"}}
	other := cust(change.OpCreate, 11, day, "C1", "name", "n", "plan", "basic")
	res, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{ev, other}})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if res.DeadLetters != 1 || res.Events != 1 {
		t.Fatalf("%d dead letters, %d events applied; want 1 and 1", res.DeadLetters, res.Events)
	}
	var msg string
	if err := pool.QueryRow(ctx, `SELECT error FROM scd2sink_dead_letters`).Scan(&msg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(msg, "63 bytes") || !strings.Contains(msg, prefix) {
		t.Errorf("dead letter error %q does not name the columns and the limit", msg)
	}
	var cols int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'wide_history'::regclass AND attname LIKE 'customer%'`).Scan(&cols); err != nil || cols != 1 {
		t.Fatalf("%d columns for the two names (%v), want 1", cols, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM wide_history`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d versions written (%v): the colliding event must not be", n, err)
	}
}
