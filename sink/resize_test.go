package sink_test

import (
	"context"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestResizedTopic: partitions added to a topic move keys between
// partitions. Recording the resize waits for a writer still applying under
// the old count; afterwards a writer that remembers a key forgets it once
// another wrote the key through another partition, so that its change
// opens a version as the fold says instead of writing into a closed one,
// and the writers take turns on the topic's lock.
func TestResizedTopic(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	cfg := sink.Config{Schema: "public", Tables: []sink.TableSpec{spec}, ConsumerGroup: "g"}
	a, b := newSinkWith(t, pool, cfg), newSinkWith(t, pool, cfg)
	topic := "shop.public.customers"
	p0, p1 := change.Partition{Topic: topic, Partition: 0}, change.Partition{Topic: topic, Partition: 1}
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	var all []*change.Event
	apply := func(s *sink.Sink, p change.Partition, off int64, evs ...*change.Event) {
		t.Helper()
		if _, err := s.Apply(ctx, sink.Batch{Events: evs, Positions: sink.At(map[change.Partition]int64{p: off})}); err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	if resized, err := a.NotePartitions(ctx, map[string]int32{topic: 1}); err != nil || len(resized) != 0 {
		t.Fatalf("first count: resized %v (%v)", resized, err)
	}
	apply(a, p0, 1, cust(change.OpCreate, 10, h(1), "K", "name", "k", "plan", "basic")) // a remembers K

	// A writer of partition 0 is still in its transaction: recording the
	// resize waits for it.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // a failing test must still give its connection back
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, a.PartitionLock(topic, 0)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.NotePartitions(ctx, map[string]int32{topic: 2})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the resize was recorded while a writer of the old count was applying (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// K's next change went to partition 1 (b's), the one after to 0 (a's).
	apply(b, p1, 1, cust(change.OpUpdate, 20, h(2), "K", "name", "k", "plan", "pro"))
	apply(a, p0, 2, cust(change.OpUpdate, 30, h(3), "K", "name", "k", "plan", "team"))
	want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, all))
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
		t.Fatalf("history differs from the fold:\n%s", d)
	}
	verifyClean(t, a, spec.Target)

	// The writers take turns: with the topic's lock held elsewhere, a
	// batch of either partition waits for it.
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx2.Rollback(ctx) }()
	if _, err := tx2.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, a.PartitionLock(topic, -1)); err != nil {
		t.Fatal(err)
	}
	applied := make(chan error, 1)
	go func() {
		_, err := a.Apply(ctx, sink.Batch{Events: []*change.Event{cust(change.OpUpdate, 40, h(4), "K", "name", "k", "plan", "basic")},
			Positions: sink.At(map[change.Partition]int64{p0: 3})})
		applied <- err
	}()
	select {
	case err := <-applied:
		t.Fatalf("a batch of a resized topic did not wait for the topic's lock (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := tx2.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
}

// TestResizeRecordedByTheBatch: a batch holding a partition beyond its
// topic's recorded count, which no assignment recorded as a resize (the
// call failed, or the member kept its partitions), records it itself
// before it applies: from then on every writer of the topic takes turns.
func TestResizeRecordedByTheBatch(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	s := newSinkWith(t, pool, sink.Config{Schema: "public", Tables: []sink.TableSpec{spec}, ConsumerGroup: "g"})
	topic := "shop.public.customers"
	if _, err := s.NotePartitions(ctx, map[string]int32{topic: 2}); err != nil {
		t.Fatal(err)
	}
	p3 := change.Partition{Topic: topic, Partition: 3}
	if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{cust(change.OpCreate, 10, day, "K", "name", "k", "plan", "basic")},
		Positions: sink.At(map[change.Partition]int64{p3: 1})}); err != nil {
		t.Fatal(err)
	}
	var parts int
	var resized bool
	if err := pool.QueryRow(ctx, `SELECT partitions, resized_at IS NOT NULL FROM scd2sink_topics WHERE topic = $1`, topic).Scan(&parts, &resized); err != nil {
		t.Fatal(err)
	}
	if parts != 4 || !resized {
		t.Fatalf("partitions %d, resized %v; want 4 and true", parts, resized)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM customers_history`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d versions (%v), want 1", n, err)
	}
}
