package sink_test

import (
	"context"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
)

// TestUpgradeKeepsWhatRowsKnow: a history table written by an scd2sink
// before schema evolution (no scd_absent, scd_raw_t, scd_attnum) is
// upgraded at start; its rows know the columns the table had then, so a
// column the source adds afterwards opens no version by itself (the
// current version learns it), as for a table written since.
func TestUpgradeKeepsWhatRowsKnow(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("upgrade")
	spec.TrackHistory = nil // every column tracked: an added one too
	s := newSink(t, pool, "upgrade", spec)
	apply(t, s, cust(change.OpCreate, 1, date(1, 1), "K", "name", "a", "plan", "p", "city", "x", "visits", 1))
	if _, err := pool.Exec(ctx, `DROP VIEW upgrade.customers_history_current, upgrade.customers_history_consistent;
		ALTER TABLE upgrade.customers_history DROP COLUMN scd_absent, DROP COLUMN scd_raw_t, DROP COLUMN scd_attnum;
		ALTER TABLE upgrade.customers_history_scd_events DROP COLUMN scd_absent, DROP COLUMN scd_raw_t, DROP COLUMN scd_attnum;
		CREATE VIEW upgrade.customers_history_current AS SELECT * FROM upgrade.customers_history WHERE is_current`); err != nil {
		t.Fatal(err)
	}
	s = newSink(t, pool, "upgrade", spec) // the new version starts
	ev := cust(change.OpUpdate, 2, date(1, 2), "K", "name", "a", "plan", "p", "city", "x", "visits", 1, "tier", "gold")
	apply(t, s, ev)
	got := scdtest.HistoryLines(t, pool, spec, append(custCols, "tier"))
	want := []string{"K seq=200101 [2026-01-01T00:00:00Z, open) current=true name=a plan=p city=x visits=1 tier=gold"}
	if d := scdtest.DiffLines(want, got); d != "" {
		t.Fatalf("an added column opened a version in an upgraded table:\n%s", d)
	}
	verifyClean(t, s, spec.Target)
}

// TestLearnedColumnSurvivesRestart: a version opened before a column was
// added learns it as NULL from an event that changes nothing else; a
// restart must know it learned it, so the column's next change opens a
// version, as the fold says (the learned NULL is written, not only kept
// in memory).
func TestLearnedColumnSurvivesRestart(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	spec := custSpec("learned")
	spec.TrackHistory = nil
	spec.Columns = spec.Columns[:4] // no visits yet
	s := newSink(t, pool, "learned", spec)
	evs := []*change.Event{
		cust(change.OpCreate, 1, date(1, 1), "K", "name", "a", "plan", "p", "city", "x"),
		cust(change.OpUpdate, 2, date(1, 2), "K", "name", "a", "plan", "p", "city", "x", "visits", nil),
	}
	apply(t, s, evs[0])
	apply(t, s, evs[1]) // visits added, learned as NULL
	s = newSink(t, pool, "learned", spec)
	evs = append(evs, cust(change.OpUpdate, 3, date(1, 3), "K", "name", "a", "plan", "p", "city", "x", "visits", 5))
	apply(t, s, evs[2])
	got := scdtest.HistoryLines(t, pool, spec, custCols)
	want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, evs))
	if d := scdtest.DiffLines(want, got); d != "" {
		t.Fatalf("after a restart the learned column was forgotten:\n%s", d)
	}
	verifyClean(t, s, spec.Target)
}
