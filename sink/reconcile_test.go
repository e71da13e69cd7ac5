package sink_test

import (
	"context"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestSnapshotReconciliation: a completed full snapshot closes the keys it
// did not read once every partition of its topic is applied past it, not
// before; keys read again, later changes of a closed key and a second
// snapshot follow the reference fold.
func TestSnapshotReconciliation(t *testing.T) {
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	spec.SnapshotDeletes = true
	s := newSink(t, pool, "public", spec)
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	read := func(seq int64, at time.Time, id, plan string, end bool) *change.Event {
		e := cust(change.OpRead, seq, at, id, "name", id, "plan", plan)
		e.SnapshotEnd = end
		return e
	}
	p0 := change.Partition{Topic: "shop.public.customers", Partition: 0}
	p1 := change.Partition{Topic: "shop.public.customers", Partition: 1}
	var all []*change.Event
	applyB := func(b sink.Batch) {
		t.Helper()
		if _, err := s.Apply(ctx, b); err != nil {
			t.Fatal(err)
		}
		all = append(all, b.Events...)
	}
	check := func(step string, evs []*change.Event) {
		t.Helper()
		want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, evs))
		if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
			t.Fatalf("%s: history differs from the fold:\n%s", step, d)
		}
		verifyClean(t, s, spec.Target)
	}
	// Streaming: A, B, C and D exist; D changes again after the snapshot.
	applyB(sink.Batch{Events: []*change.Event{
		cust(change.OpCreate, 10, h(1), "A", "name", "A", "plan", "basic"),
		cust(change.OpCreate, 11, h(1), "B", "name", "B", "plan", "basic"),
		cust(change.OpCreate, 12, h(1), "C", "name", "C", "plan", "basic"),
		cust(change.OpCreate, 13, h(1), "D", "name", "D", "plan", "basic"),
	}, Offsets: map[change.Partition]int64{p0: 4}})
	// The snapshot at seq 100 reads A (changed) and C; B and D were
	// deleted while capture was down. Its records lie below offsets 7 and 3.
	snap := sink.Snapshot{Target: spec.Target, Seq: change.MustSeq(100), At: h(10), Topic: p0.Topic, Until: map[int32]int64{0: 7, 1: 3}}
	applyB(sink.Batch{Events: []*change.Event{read(100, h(10), "A", "pro", false), read(100, h(10), "C", "basic", true)},
		Offsets: map[change.Partition]int64{p0: 7}, Snapshots: []sink.Snapshot{snap}})
	// Partition 1 is not past the snapshot yet: nothing closed.
	check("before partition 1 is applied", withoutEnds(all))
	// D changes after the snapshot, in partition 1's batch that passes it.
	applyB(sink.Batch{Events: []*change.Event{cust(change.OpUpdate, 150, h(15), "D", "name", "D", "plan", "team")},
		Offsets: map[change.Partition]int64{p1: 3}})
	check("reconciled", all)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_snapshots WHERE done_at IS NOT NULL`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d snapshots marked done (%v)", n, err)
	}
	// A second snapshot at 200 reads B again (re-created) and not A.
	snap2 := sink.Snapshot{Target: spec.Target, Seq: change.MustSeq(200), At: h(20), Topic: p0.Topic, Until: map[int32]int64{0: 9, 1: 3}}
	applyB(sink.Batch{Events: []*change.Event{read(200, h(20), "B", "basic", false), read(200, h(20), "C", "basic", false),
		read(200, h(20), "D", "team", true)}, Offsets: map[change.Partition]int64{p0: 9}, Snapshots: []sink.Snapshot{snap2}})
	check("second snapshot", all)
	// Replayed: the same batches again change nothing.
	if _, err := s.Apply(ctx, sink.Batch{Events: all, Snapshots: []sink.Snapshot{snap, snap2}}); err != nil {
		t.Fatal(err)
	}
	check("replayed", all)
}

// withoutEnds is evs with no snapshot completed: what the history holds
// before reconciliation.
func withoutEnds(evs []*change.Event) []*change.Event {
	out := make([]*change.Event, len(evs))
	for i, e := range evs {
		c := *e
		c.SnapshotEnd = false
		out[i] = &c
	}
	return out
}

// TestReconciliationResetsOtherWritersCaches: the instance that reconciles
// closes keys whose latest state another instance, owning another
// partition, remembers; that one must not trust its memory afterwards.
func TestReconciliationResetsOtherWritersCaches(t *testing.T) {
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	spec.SnapshotDeletes = true
	owner, other := newSink(t, pool, "public", spec), newSink(t, pool, "public", spec)
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	p0 := change.Partition{Topic: "shop.public.customers", Partition: 0}
	p1 := change.Partition{Topic: "shop.public.customers", Partition: 1}
	var all []*change.Event
	apply := func(s *sink.Sink, b sink.Batch) {
		t.Helper()
		if _, err := s.Apply(ctx, b); err != nil {
			t.Fatal(err)
		}
		all = append(all, b.Events...)
	}
	apply(owner, sink.Batch{Events: []*change.Event{
		cust(change.OpCreate, 10, h(1), "K1", "name", "one", "plan", "basic"),
		cust(change.OpCreate, 11, h(1), "K2", "name", "two", "plan", "basic"),
	}, Offsets: map[change.Partition]int64{p0: 2}})
	end := cust(change.OpRead, 100, h(5), "K2", "name", "two", "plan", "basic")
	end.SnapshotEnd = true
	apply(other, sink.Batch{Events: []*change.Event{end}, Offsets: map[change.Partition]int64{p1: 1},
		Snapshots: []sink.Snapshot{{Target: spec.Target, Seq: change.MustSeq(100), At: h(5), Topic: p0.Topic, Until: map[int32]int64{0: 2, 1: 1}}}})
	// K1 was closed at the snapshot; a later Type-1-only change opens a
	// new version, whatever the owner remembers.
	apply(owner, sink.Batch{Events: []*change.Event{cust(change.OpUpdate, 150, h(8), "K1", "name", "uno", "plan", "basic")},
		Offsets: map[change.Partition]int64{p0: 3}})
	want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, all))
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
		t.Fatalf("history differs from the fold:\n%s", d)
	}
	verifyClean(t, owner, spec.Target)
}
