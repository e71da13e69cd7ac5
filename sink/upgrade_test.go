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
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("upgrade")
	spec.TrackHistory = nil // every column tracked: an added one too
	s := newSink(t, pool, "upgrade", spec)
	apply(t, s, cust(change.OpCreate, 1, date(1, 1), "K", "name", "a", "plan", "p", "city", "x", "visits", 1))
	if _, err := pool.Exec(ctx, `DROP VIEW upgrade.customers_history_current;
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
