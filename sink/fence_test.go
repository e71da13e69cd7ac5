package sink_test

import (
	"context"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// TestOutsideWritersWait: erase and a retention chunk wait for the writers
// of an exact topic's partitions, of the sink's group and of another (a
// rebuild's), as a writer holding its partition's lock stands for: a
// batch in flight cannot write an erased key or a removed version after
// them.
func TestOutsideWritersWait(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	const schema = "fence_wait"
	spec := custSpec(schema)
	spec.Topic, spec.Retention = "shop.public.customers", 24*time.Hour
	s := newSinkWith(t, pool, sink.Config{Schema: schema, Tables: []sink.TableSpec{spec}, ConsumerGroup: "live",
		ErasureSecret: []byte("a secret of thirty-two bytes...."), ReorderWindow: time.Second})
	old := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p0, p1 := change.Partition{Topic: spec.Topic, Partition: 0}, change.Partition{Topic: spec.Topic, Partition: 1}
	for i, p := range []change.Partition{p0, p1} {
		if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{
			cust(change.OpCreate, int64(10*i+1), old, "C"+itoa(i), "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(change.OpUpdate, int64(10*i+2), old.Add(time.Hour), "C"+itoa(i), "name", "a", "plan", "q", "city", "x", "visits", 1),
			// A key no subtest erases: retention has old versions to remove.
			cust(change.OpCreate, int64(10*i+3), old, "R"+itoa(i), "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(change.OpUpdate, int64(10*i+4), old.Add(time.Hour), "R"+itoa(i), "name", "a", "plan", "q", "city", "x", "visits", 1),
		}, Positions: map[change.Partition]sink.Position{p: {Offset: 4, Target: spec.Target}}}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	if err := s.Watermark(ctx, map[change.Partition]sink.Look{p0: {Target: spec.Target, At: &now}, p1: {Target: spec.Target, At: &now}}); err != nil {
		t.Fatal(err)
	}
	// A rebuild's group records offsets of the same topic.
	if _, err := pool.Exec(ctx, `INSERT INTO fence_wait.scd2sink_offsets (consumer_group, topic, partition, next_offset, target)
		VALUES ('live__rebuild', $1, 3, 1, 'customers_history__rebuild')`, spec.Topic); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, group string
		part        int32
		run         func() error
	}{
		{"erase, a rebuild's group", "live__rebuild", 3, func() error {
			_, err := s.Erase(ctx, sink.EraseRequest{Target: spec.Target, Keys: [][]string{{"C1"}}})
			return err
		}},
		{"erase, own group", "live", 1, func() error {
			_, err := s.Erase(ctx, sink.EraseRequest{Target: spec.Target, Keys: [][]string{{"C0"}}})
			return err
		}},
		{"retention, own group", "live", 1, func() error {
			_, err := s.Retain(ctx, spec.Target, now, nil)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", sink.PartitionLockOf(tc.group, spec.Topic, tc.part)); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- tc.run() }()
			select {
			case err := <-done:
				t.Fatalf("finished while a writer of partition %d was in flight: %v", tc.part, err)
			case <-time.After(500 * time.Millisecond):
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}
