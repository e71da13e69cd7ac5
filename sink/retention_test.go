package sink_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestRetention: a pass removes the versions closed before the horizon
// and the side rows before what is left, in chunks, never a current
// version; a replay of every event brings nothing back (the events before
// what is left are dead letters, counted), later events and late events
// after the horizon apply as the fold says; verify stays clean; a second
// pass removes nothing.
func TestRetention(t *testing.T) {
	t.Parallel()
	for _, mode := range []sink.DeletesMode{sink.DeletesClose, sink.DeletesNewRecord} {
		t.Run(string(mode), func(t *testing.T) {
			pool := newPool(t)
			ctx := context.Background()
			schema := "ret_" + string(mode)
			spec := custSpec(schema)
			spec.Deletes, spec.Retention = mode, 30*24*time.Hour
			now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
			old := func(day int) time.Time { return time.Date(2026, 1, day, 0, 0, 0, 0, time.UTC) }
			recent := func(day int) time.Time { return time.Date(2026, 5, 20+day, 0, 0, 0, 0, time.UTC) }
			c, u, del := change.OpCreate, change.OpUpdate, change.OpDelete
			evs := []*change.Event{
				cust(c, 1, old(1), "A", "name", "a", "plan", "p", "city", "x", "visits", 1),
				cust(u, 2, old(1), "A", "name", "a2", "plan", "p", "city", "x", "visits", 2), // Type 1 only: a side row
				cust(u, 3, old(2), "A", "name", "a", "plan", "q", "city", "x", "visits", 2),
				cust(u, 4, old(3), "A", "name", "a", "plan", "r", "city", "x", "visits", 2), // current since January
				cust(c, 5, old(1), "B", "name", "b", "plan", "p", "city", "y", "visits", 1),
				cust(del, 6, old(2), "B"),
				cust(del, 7, old(1), "D"), // a delete of a row never seen: a side row only
				cust(c, 8, recent(1), "C", "name", "c", "plan", "p", "city", "z", "visits", 1),
				cust(u, 9, recent(2), "C", "name", "c", "plan", "q", "city", "z", "visits", 1),
				cust(c, 10, old(1), "E", "name", "e", "plan", "p", "city", "x", "visits", 1),
				cust(u, 11, old(4), "E", "name", "e", "plan", "q", "city", "x", "visits", 1),
				cust(u, 12, recent(1), "E", "name", "e", "plan", "r", "city", "x", "visits", 1),
			}
			if mode == sink.DeletesNewRecord {
				// A key whose history before its version marked deleted
				// goes: a placeholder after it comes later (below).
				evs = append(evs, cust(c, 14, old(1), "G", "name", "g", "plan", "p", "city", "x", "visits", 1), cust(del, 15, old(2), "G"))
			}
			for i := range 5 { // more keys than a chunk, closed long ago
				id := "F" + itoa(i)
				evs = append(evs, cust(c, int64(20+2*i), old(1), id, "name", "f", "plan", "p", "city", "x", "visits", 1),
					cust(u, int64(21+2*i), old(2), id, "name", "f", "plan", "q", "city", "x", "visits", 1))
			}
			s := newSink(t, pool, schema, spec)
			// Chunks of 2 keys; windows of 3 rows: most keys' rows span
			// two picks.
			s.Tune(func(tu *sink.Tuning) { tu.RetentionChunk, tu.RetentionWindow = 2, 3 })
			apply(t, s, evs...)
			// Without a watermark nothing is known of what late events
			// still need: nothing goes.
			if res, err := s.Retain(ctx, spec.Target, now, nil); err != nil || res.Versions != 0 || !res.Horizon.IsZero() {
				t.Fatalf("a pass without a watermark: %+v %v", res, err)
			}
			if err := s.Watermark(ctx, map[change.Partition]sink.Look{{Topic: "cust", Partition: 0}: {Target: spec.Target, At: &now}}); err != nil {
				t.Fatal(err)
			}
			fences := func() (n int64) {
				t.Helper()
				_ = pool.QueryRow(ctx, "SELECT coalesce(sum(n), 0) FROM "+schema+".scd2sink_outside_writes").Scan(&n)
				return n
			}
			before := fences()
			res, err := s.Retain(ctx, spec.Target, now, nil)
			if err != nil {
				t.Fatal(err)
			}
			horizon := now.Add(-spec.Retention)
			if !res.Horizon.Equal(horizon) || res.Versions == 0 || res.Chunks < 3 {
				t.Errorf("pass: %+v", res)
			}
			// One fence for the pass, not one per chunk: each empties
			// every writer's whole state cache.
			if n := fences() - before; n != 1 {
				t.Errorf("a pass of %d chunks fenced the writers %d times, want once", res.Chunks, n)
			}
			want := func(evs []*change.Event) []string {
				return scdtest.ModelLines(spec, custCols, scdtest.Retained(scdtest.Fold(spec, custCols, evs), horizon))
			}
			check := func(when string, evs []*change.Event) {
				t.Helper()
				if d := scdtest.DiffLines(want(evs), scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
					t.Fatalf("%s: differs from the retained fold:\n%s", when, d)
				}
				verifyClean(t, s, spec.Target)
			}
			check("after the pass", evs)
			var side int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".customers_history_scd_events WHERE scd_op <> 'h' AND scd_t < $1", horizon).Scan(&side); err != nil || side != 0 {
				t.Errorf("%d side rows before the horizon are left (%v)", side, err)
			}
			again, err := s.Retain(ctx, spec.Target, now, nil)
			// (Nor does it rewrite the horizon rows of keys that have
			// nothing else, as a window's last key: Keys and Chunks.)
			if err != nil || again.Versions != 0 || again.SideRows != 0 || again.Keys != 0 || again.Chunks != 0 {
				t.Errorf("a second pass: %+v %v", again, err)
			}

			// A replay of everything, by a sink that remembers nothing
			// and by the one that does: nothing removed comes back, and
			// nothing is dead-lettered — every event is a duplicate of
			// one kept or counted as expired (DESIGN.md section 12).
			for _, w := range []*sink.Sink{newSink(t, pool, schema, spec), s} {
				r, err := w.Apply(ctx, sink.Batch{Events: evs})
				if err != nil {
					t.Fatal(err)
				}
				if r.DeadLetters != 0 || len(r.Dead) != 0 {
					t.Errorf("the replay dead-lettered %d events: %+v", r.DeadLetters, r.Dead)
				}
				if n := r.Expired[spec.Target]; n == 0 || n+r.Duplicates != len(evs) || len(r.ExpiredNotes) == 0 {
					t.Errorf("the replay of %d events: %d expired, %d duplicates (%d notes); want every event one or the other", len(evs), n, r.Duplicates, len(r.ExpiredNotes))
				}
				var letters int
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".scd2sink_dead_letters").Scan(&letters); err != nil || letters != 0 {
					t.Errorf("%d dead letters stored (%v)", letters, err)
				}
				check("after a replay", evs)
			}
			// Later events, and a late one after the horizon.
			more := []*change.Event{
				cust(u, 100, now, "A", "name", "a", "plan", "s", "city", "x", "visits", 3),
				cust(c, 101, now, "B", "name", "b", "plan", "p", "city", "y", "visits", 1),
				cust(u, 102, now.Add(time.Hour), "C", "name", "c", "plan", "t", "city", "z", "visits", 1),
			}
			late := []*change.Event{cust(u, 13, recent(2), "E", "name", "e", "plan", "late", "city", "x", "visits", 1)}
			if mode == sink.DeletesNewRecord {
				// The placeholder takes the version marked deleted's
				// value (the closed version's, gone), on the append path
				// and when the late event's repair folds again from the
				// version marked deleted.
				more = append(more, cust(u, 103, now, "G", "name", "g", "plan", "q", "city", change.Unavailable, "visits", 1),
					cust(u, 105, now.Add(2*time.Hour), "G", "name", "g", "plan", "r", "city", "x", "visits", 1))
				late = append(late, cust(u, 104, now.Add(time.Hour), "G", "name", "g", "plan", "q", "city", "x", "visits", 1))
			}
			apply(t, s, more...)
			apply(t, s, late...)
			check("after later events", append(append(evs, more...), late...))
		})
	}
}

// TestRetentionPicksUnlocked: a pass finds the keys it will work on
// without the writers' lock (a writer applies meanwhile, without waiting
// for the pass), and under the lock removes only what each key still
// qualifies for: a key that had only side rows when it was picked and
// got a version before its chunk ran keeps its side rows.
func TestRetentionPicksUnlocked(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("public")
	spec.Retention = 30 * 24 * time.Hour
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	old := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c, u, del := change.OpCreate, change.OpUpdate, change.OpDelete
	evs := []*change.Event{
		cust(c, 1, old, "A", "name", "a", "plan", "p", "city", "x", "visits", 1),
		cust(u, 2, old.Add(time.Hour), "A", "name", "a", "plan", "q", "city", "x", "visits", 1),
		cust(del, 3, old, "D"), // a delete of a row never seen: side rows only
	}
	s := newSink(t, pool, "public", spec)
	apply(t, s, evs...)
	if err := s.Watermark(ctx, map[change.Partition]sink.Look{{Topic: "cust", Partition: 0}: {Target: spec.Target, At: &now}}); err != nil {
		t.Fatal(err)
	}
	recreate := cust(c, 50, now.Add(-time.Hour), "D", "name", "d", "plan", "p", "city", "y", "visits", 1)
	var phases []string
	s.Tune(func(tu *sink.Tuning) {
		tu.AfterRetentionPick = func(phase string) {
			phases = append(phases, phase)
			if phase == "side" {
				// The writers' lock is free: this applies at once.
				done := make(chan error, 1)
				go func() {
					_, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{recreate}})
					done <- err
				}()
				select {
				case err := <-done:
					if err != nil {
						t.Error(err)
					}
				case <-time.After(20 * time.Second):
					t.Fatal("a writer waited for retention's pick")
				}
			}
		}
	})
	res, err := s.Retain(ctx, spec.Target, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(phases, ",") != "versions,side" || res.Versions != 1 {
		t.Fatalf("phases %v, result %+v; want one chunk of each, one version removed", phases, res)
	}
	var side int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM customers_history_scd_events WHERE customer_id = 'D' AND scd_op = 'd'`).Scan(&side); err != nil || side != 1 {
		t.Fatalf("D's side row: %d left (%v); want it kept, D has a version now", side, err)
	}
	all := append(evs, recreate)
	want := scdtest.ModelLines(spec, custCols, scdtest.Retained(scdtest.Fold(spec, custCols, all), now.Add(-spec.Retention)))
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
		t.Fatalf("differs from the retained fold:\n%s", d)
	}
	verifyClean(t, s, spec.Target)
}
