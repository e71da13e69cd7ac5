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
	t.Parallel()
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
	}, Positions: sink.At(map[change.Partition]int64{p0: 4})})
	// The snapshot at seq 100 reads A (changed) and C; B and D were
	// deleted while capture was down. Its records lie below offsets 7 and 3.
	snap := sink.Snapshot{Target: spec.Target, Seq: change.MustSeq(100), At: h(10), Topic: p0.Topic, Until: map[int32]int64{0: 7, 1: 3}}
	applyB(sink.Batch{Events: []*change.Event{read(100, h(10), "A", "pro", false), read(100, h(10), "C", "basic", true)},
		Positions: sink.At(map[change.Partition]int64{p0: 7}), Snapshots: []sink.Snapshot{snap}})
	// Partition 1 is not past the snapshot yet: nothing closed.
	check("before partition 1 is applied", withoutEnds(all))
	// D changes after the snapshot, in partition 1's batch that passes it.
	applyB(sink.Batch{Events: []*change.Event{cust(change.OpUpdate, 150, h(15), "D", "name", "D", "plan", "team")},
		Positions: sink.At(map[change.Partition]int64{p1: 3})})
	check("reconciled", all)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_snapshots WHERE done_at IS NOT NULL`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d snapshots marked done (%v)", n, err)
	}
	// A second snapshot at 200 reads B again (re-created) and not A.
	snap2 := sink.Snapshot{Target: spec.Target, Seq: change.MustSeq(200), At: h(20), Topic: p0.Topic, Until: map[int32]int64{0: 9, 1: 3}}
	applyB(sink.Batch{Events: []*change.Event{read(200, h(20), "B", "basic", false), read(200, h(20), "C", "basic", false),
		read(200, h(20), "D", "team", true)}, Positions: sink.At(map[change.Partition]int64{p0: 9}), Snapshots: []sink.Snapshot{snap2}})
	check("second snapshot", all)
	// Late events below both snapshots, after both are reconciled (a
	// dead letter replayed, a member's backlog): E, which neither read, is
	// closed at the first; F, created between them and read by neither,
	// at the second; A's late change stays closed at the second.
	applyB(sink.Batch{Events: []*change.Event{
		cust(change.OpCreate, 50, h(5), "E", "name", "E", "plan", "basic"),
		cust(change.OpCreate, 150, h(15), "F", "name", "F", "plan", "basic"),
		cust(change.OpUpdate, 160, h(16), "A", "name", "A", "plan", "team"),
	}, Positions: sink.At(map[change.Partition]int64{p0: 12})})
	check("late events after the reconciliations", all)
	// Replayed: the same batches again change nothing.
	if _, err := s.Apply(ctx, sink.Batch{Events: all, Snapshots: []sink.Snapshot{snap, snap2}}); err != nil {
		t.Fatal(err)
	}
	check("replayed", all)
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_snapshots_late`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d late notes left (%v)", n, err)
	}
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
	t.Parallel()
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
	}, Positions: sink.At(map[change.Partition]int64{p0: 2})})
	end := cust(change.OpRead, 100, h(5), "K2", "name", "two", "plan", "basic")
	end.SnapshotEnd = true
	apply(other, sink.Batch{Events: []*change.Event{end}, Positions: sink.At(map[change.Partition]int64{p1: 1}),
		Snapshots: []sink.Snapshot{{Target: spec.Target, Seq: change.MustSeq(100), At: h(5), Topic: p0.Topic, Until: map[int32]int64{0: 2, 1: 1}}}})
	// K1 was closed at the snapshot; a later Type-1-only change opens a
	// new version, whatever the owner remembers.
	apply(owner, sink.Batch{Events: []*change.Event{cust(change.OpUpdate, 150, h(8), "K1", "name", "uno", "plan", "basic")},
		Positions: sink.At(map[change.Partition]int64{p0: 3})})
	want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, all))
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
		t.Fatalf("history differs from the fold:\n%s", d)
	}
	verifyClean(t, owner, spec.Target)
}

// TestReconciliationGuard: with MaxCloseFraction 0.5, a snapshot that
// would close at most half the live keys is reconciled; one that would
// close more is held (nothing closed, recorded with its counts, changes
// after it applied as usual) until Confirm, from another Sink as the
// reconcile command does, closes the keys as late deletes: the history
// then equals the fold with the snapshot.
func TestReconciliationGuard(t *testing.T) {
	t.Parallel()
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	p0 := change.Partition{Topic: "shop.public.customers", Partition: 0}
	for _, tc := range []struct {
		name string
		read []string // the keys the snapshot reads, of A..D
		held bool
	}{
		{"half closed: reconciled", []string{"A", "B"}, false},
		{"three of four closed: held", []string{"A"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := newPool(t)
			ctx := context.Background()
			spec := custSpec("public")
			spec.SnapshotDeletes, spec.MaxCloseFraction = true, 0.5
			s := newSink(t, pool, "public", spec)
			var all []*change.Event
			apply := func(b sink.Batch) {
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
			var creates []*change.Event
			for i, id := range []string{"A", "B", "C", "D"} {
				creates = append(creates, cust(change.OpCreate, int64(10+i), h(1), id, "name", id, "plan", "basic"))
			}
			apply(sink.Batch{Events: creates, Positions: sink.At(map[change.Partition]int64{p0: 4})})
			// The snapshot reads its first key changed (plan pro): still a
			// live key, its version before the snapshot closed by it.
			var reads []*change.Event
			for i, id := range tc.read {
				plan := "basic"
				if i == 0 {
					plan = "pro"
				}
				e := cust(change.OpRead, 100, h(10), id, "name", id, "plan", plan)
				e.SnapshotEnd = i == len(tc.read)-1
				reads = append(reads, e)
			}
			apply(sink.Batch{Events: reads, Positions: sink.At(map[change.Partition]int64{p0: 4 + int64(len(reads))}),
				Snapshots: []sink.Snapshot{{Target: spec.Target, Seq: change.MustSeq(100), At: h(10), Topic: p0.Topic, Until: map[int32]int64{0: 4 + int64(len(reads))}}}})
			// D changes after the snapshot.
			apply(sink.Batch{Events: []*change.Event{cust(change.OpUpdate, 150, h(15), "D", "name", "D", "plan", "team")},
				Positions: sink.At(map[change.Partition]int64{p0: 5 + int64(len(reads))})})
			held, err := s.HeldReconciliations(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			if !tc.held {
				if len(held) != 0 {
					t.Fatalf("held: %+v", held)
				}
				check("reconciled", all)
				return
			}
			if len(held) != 1 || held[0].Closing != 3 || held[0].Live != 4 || held[0].Target != spec.Target {
				t.Fatalf("held: %+v, want one closing 3 of 4 live keys", held)
			}
			check("held", withoutEnds(all))
			confirmer := newSink(t, pool, "public", spec)
			got, err := confirmer.Confirm(ctx, spec.Target)
			if err != nil || len(got) != 1 {
				t.Fatalf("Confirm: %v, %+v", err, got)
			}
			check("confirmed", all)
			if left, err := s.HeldReconciliations(ctx, ""); err != nil || len(left) != 0 {
				t.Fatalf("still held after Confirm: %+v (%v)", left, err)
			}
			var repairs int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM customers_history_scd_repairs`).Scan(&repairs); err != nil || repairs == 0 {
				t.Errorf("%d repair rows (%v): D's delete at the snapshot, before its later change, is a repair", repairs, err)
			}
			// The instance that applied the batches goes on exactly.
			apply(sink.Batch{Events: []*change.Event{cust(change.OpUpdate, 160, h(16), "B", "name", "B", "plan", "pro")},
				Positions: sink.At(map[change.Partition]int64{p0: 6 + int64(len(reads))})})
			check("after", all)
		})
	}
}
