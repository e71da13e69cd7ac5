package sink_test

import (
	"fmt"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
)

// A primary-key change with Debezium's equal sequences (the old key's
// delete and the new key's create share one source.lsn), the create's and
// later updates' unchanged columns placeholders, gives the same history in
// every batching the sequencer may produce: the old key's events up to its
// delete in the create's batch or an earlier one, in any order within a
// batch, and again when everything is redelivered.
func TestKeyChangeInEveryBatching(t *testing.T) {
	t.Parallel()
	const na = change.Unavailable
	sent := func() []*change.Event {
		del := cust(change.OpDelete, 40, date(4, 1), "C1")
		del.KeyChanged = true
		create := cust(change.OpCreate, 40, date(4, 1), "C9", "name", na, "plan", "pro", "city", "Graz", "visits", na)
		create.OldKey = []any{"C1"}
		return []*change.Event{
			cust(change.OpRead, 10, date(1, 1), "C1", "name", "Sarah", "plan", "basic", "city", "Wien", "visits", 1),
			cust(change.OpUpdate, 20, date(2, 1), "C1", "name", na, "plan", "basic", "city", "Wien", "visits", 2),
			cust(change.OpUpdate, 30, date(3, 1), "C1", "name", "Sara", "plan", "pro", "city", "Wien", "visits", na),
			del, create,
			cust(change.OpUpdate, 50, date(5, 1), "C9", "name", na, "plan", "pro", "city", "Linz", "visits", 7),
		}
	}
	resolved := []*change.Event{
		cust(change.OpRead, 10, date(1, 1), "C1", "name", "Sarah", "plan", "basic", "city", "Wien", "visits", 1),
		cust(change.OpUpdate, 20, date(2, 1), "C1", "name", "Sarah", "plan", "basic", "city", "Wien", "visits", 2),
		cust(change.OpUpdate, 30, date(3, 1), "C1", "name", "Sara", "plan", "pro", "city", "Wien", "visits", 2),
		cust(change.OpDelete, 40, date(4, 1), "C1"),
		cust(change.OpCreate, 40, date(4, 1), "C9", "name", "Sara", "plan", "pro", "city", "Graz", "visits", 2),
		cust(change.OpUpdate, 50, date(5, 1), "C9", "name", "Sara", "plan", "pro", "city", "Linz", "visits", 7),
	}
	batchings := []struct {
		name string
		cut  func(evs []*change.Event) [][]*change.Event
	}{
		{"one batch", func(evs []*change.Event) [][]*change.Event { return [][]*change.Event{evs} }},
		{"one batch, create before delete", func(evs []*change.Event) [][]*change.Event {
			return [][]*change.Event{{evs[4], evs[5], evs[0], evs[1], evs[2], evs[3]}}
		}},
		{"one by one", oneByOne},
		{"old key first, the rest together", func(evs []*change.Event) [][]*change.Event {
			return [][]*change.Event{evs[:3], evs[3:]}
		}},
		{"old key with its delete, then the new key", func(evs []*change.Event) [][]*change.Event {
			return [][]*change.Event{evs[:4], evs[4:]}
		}},
		{"the new key's update late", func(evs []*change.Event) [][]*change.Event {
			return [][]*change.Event{{evs[0], evs[1]}, {evs[2], evs[4], evs[3]}, {evs[5]}}
		}},
	}
	pool := sharedPool(t)
	spec0 := custSpec("")
	want := scdtest.ModelLines(spec0, custCols, scdtest.Fold(spec0, custCols, resolved))
	for i, b := range batchings {
		t.Run(b.name, func(t *testing.T) {
			schema := fmt.Sprintf("keychange_%d", i)
			if _, err := pool.Exec(t.Context(), "CREATE SCHEMA "+schema); err != nil {
				t.Fatal(err)
			}
			spec := custSpec(schema)
			s := newSink(t, pool, schema, spec)
			for _, batch := range b.cut(sent()) {
				apply(t, s, batch...)
			}
			apply(t, s, sent()...) // redelivered
			got := scdtest.HistoryLines(t, pool, spec, custCols)
			if d := scdtest.DiffLines(want, got); d != "" {
				t.Fatalf("history differs from the fold:\n%s", d)
			}
			verifyClean(t, s, spec.Target)
		})
	}
}
