package sink_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestReplayOnce: a batch replaying a dead letter marks it replayed in its
// transaction; the same replay again (another replay that read the dead
// letter before the first committed) applies nothing and says so.
func TestReplayOnce(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	s := newSink(t, pool, "public", spec)
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	p0 := change.Partition{Topic: "shop.public.customers", Partition: 0}
	first := cust(change.OpCreate, 10, h(1), "A", "name", "A", "plan", "basic")
	last := cust(change.OpUpdate, 30, h(3), "A", "name", "A", "plan", "team")
	if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{first, last}, Positions: sink.At(map[change.Partition]int64{p0: 3})}); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO scd2sink_dead_letters (topic, partition, "offset", target, error) VALUES ($1, 0, 1, $2, 'x') RETURNING id`,
		p0.Topic, spec.Target).Scan(&id); err != nil {
		t.Fatal(err)
	}
	late := cust(change.OpUpdate, 20, h(2), "A", "name", "A", "plan", "pro")
	late.Origin = change.Origin{Partition: p0, Offset: 1}
	replay := sink.Batch{Events: []*change.Event{late}, Lock: []change.Partition{p0}, Replay: map[change.Origin][]int64{late.Origin: {id}}}
	if _, err := s.Apply(ctx, replay); err != nil {
		t.Fatal(err)
	}
	want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, []*change.Event{first, late, last}))
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
		t.Fatalf("replayed: history differs from the fold:\n%s", d)
	}
	other := newSink(t, pool, "public", spec)
	if _, err := other.Apply(ctx, replay); !errors.Is(err, sink.ErrReplayedAlready) {
		t.Fatalf("the same replay again: %v, want ErrReplayedAlready", err)
	}
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
		t.Fatalf("after the second replay: history differs from the fold:\n%s", d)
	}
	var replayed *time.Time
	if err := pool.QueryRow(ctx, `SELECT replayed_at FROM scd2sink_dead_letters WHERE id = $1`, id).Scan(&replayed); err != nil || replayed == nil {
		t.Fatalf("replayed_at %v (%v)", replayed, err)
	}
}
