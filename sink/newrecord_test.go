package sink_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestNewRecordPresentation: under deletes: new_record the version a delete
// opens is in the table (scd_deleted), left out of _current and of
// _as_of (the rows as they were: _as_of(now()) is _current), shown by a view unless it says deleted: hide; verify knows the
// new invariants and finds a version marked wrongly.
func TestNewRecordPresentation(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	spec := custSpec("newrec")
	spec.Deletes = sink.DeletesNewRecord
	spec.Views = []sink.ViewSpec{
		{Name: "dim_all", Columns: map[string]string{"scd_deleted": "IsDeleted"}},
		{Name: "dim_live", HideDeleted: true, Day: true, TimeZone: "UTC"},
	}
	d := func(day int) time.Time { return time.Date(2026, 1, day, 0, 0, 0, 0, time.UTC) }
	c, del := change.OpCreate, change.OpDelete
	s := newSink(t, pool, "newrec", spec)
	apply(t, s,
		cust(c, 1, d(1), "A", "name", "a", "plan", "p", "city", "x", "visits", 1),
		cust(c, 2, d(1), "B", "name", "b", "plan", "p", "city", "y", "visits", 1),
		cust(del, 3, d(3), "A"),
	)
	for _, c := range []struct{ name, q string }{
		{"_current", `SELECT customer_id FROM newrec.customers_history_current ORDER BY 1`},
		{"_as_of", `SELECT customer_id || ' ' || scd_deleted FROM newrec.customers_history_as_of('2026-01-05') ORDER BY 1`},
		{"view", `SELECT customer_id || ' ' || "IsDeleted" FROM newrec.dim_all ORDER BY 1, scd_id`},
		{"hidden", `SELECT customer_id FROM newrec.dim_live ORDER BY 1, scd_id`},
	} {
		got := viewRows(t, pool, c.q)
		want := map[string][]string{
			"_current": {"B"},
			"_as_of":   {"B false"},
			"view":     {"A false", "A true", "B false"},
			"hidden":   {"A", "B"},
		}[c.name]
		if !slices.Equal(got, want) {
			t.Errorf("%s: got %v, want %v", c.name, got, want)
		}
	}
	verifyClean(t, s, spec.Target)

	// The view keeps scd_deleted among the source columns: a column added
	// at the source comes after it, as CREATE OR REPLACE VIEW allows.
	spec.Columns = append(spec.Columns, sink.Column{Name: "tier", Type: "text"})
	s = newSink(t, pool, "newrec", spec)
	apply(t, s, cust(c, 4, d(4), "A", "name", "a", "plan", "q", "city", "x", "visits", 1, "tier", "gold"))
	cols := viewRows(t, pool, `SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = 'newrec.dim_all'::regclass AND attnum > 0`)
	if want := "scd_id,valid_from,valid_to,is_current,customer_id,name,plan,city,visits,IsDeleted,tier"; len(cols) != 1 || cols[0] != want {
		t.Errorf("dim_all's columns: %v, want %s", cols, want)
	}
	if got := viewRows(t, pool, `SELECT customer_id FROM newrec.customers_history_current ORDER BY 1`); !slices.Equal(got, []string{"A", "B"}) {
		t.Errorf("_current after the re-create: %v", got)
	}
	verifyClean(t, s, spec.Target)

	if _, err := pool.Exec(ctx, `UPDATE newrec.customers_history SET scd_deleted = true WHERE customer_id = 'B'`); err != nil {
		t.Fatal(err)
	}
	vs, err := s.Verify(ctx, spec.Target)
	if err != nil {
		t.Fatal(err)
	}
	var checks []string
	for _, v := range vs {
		checks = append(checks, v.Check)
	}
	if !slices.Contains(checks, "scd_deleted disagrees with scd_op") {
		t.Errorf("verify after marking a live version deleted by hand: %v", vs)
	}
}

// TestNewRecordSwitch: a table written with deletes: close that switches
// to new_record gets scd_deleted without losing a row, its _current view
// leaves deleted versions out from then on, and old deletes stay as they
// were; switched back, the deleted version is closed by the next create.
func TestNewRecordSwitch(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	d := func(day int) time.Time { return time.Date(2026, 1, day, 0, 0, 0, 0, time.UTC) }
	c, del := change.OpCreate, change.OpDelete
	spec := custSpec("nrswitch")
	s := newSink(t, pool, "nrswitch", spec)
	apply(t, s,
		cust(c, 1, d(1), "A", "name", "a", "plan", "p", "city", "x", "visits", 1),
		cust(del, 2, d(2), "A"),
		cust(c, 3, d(3), "B", "name", "b", "plan", "p", "city", "y", "visits", 1),
	)
	spec.Deletes = sink.DeletesNewRecord
	s = newSink(t, pool, "nrswitch", spec)
	apply(t, s, cust(del, 4, d(4), "B"))
	got := scdtest.HistoryLines(t, pool, spec, custCols)
	want := []string{
		"A seq=200101 [2026-01-01T00:00:00Z, 2026-01-02T00:00:00Z) current=false name=a plan=p city=x visits=1",
		"B seq=200103 [2026-01-03T00:00:00Z, 2026-01-04T00:00:00Z) current=false name=b plan=p city=y visits=1",
		"B seq=200104 [2026-01-04T00:00:00Z, open) current=true deleted name=b plan=p city=y visits=1",
	}
	if dd := scdtest.DiffLines(want, got); dd != "" {
		t.Fatalf("after the switch:\n%s", dd)
	}
	if cur := viewRows(t, pool, `SELECT count(*)::text FROM nrswitch.customers_history_current`); !slices.Equal(cur, []string{"0"}) {
		t.Errorf("_current after the switch: %v rows, want 0", cur)
	}
	if cur := viewRows(t, pool, `SELECT count(*)::text FROM nrswitch.customers_history_as_of('infinity')`); !slices.Equal(cur, []string{"0"}) {
		t.Errorf("_as_of after the switch: %v rows, want 0", cur)
	}
	verifyClean(t, s, spec.Target)

	spec.Deletes = sink.DeletesClose
	s = newSink(t, pool, "nrswitch", spec)
	apply(t, s, cust(c, 5, d(5), "B", "name", "b", "plan", "p", "city", "y", "visits", 1), cust(del, 6, d(6), "B"))
	got = scdtest.HistoryLines(t, pool, spec, custCols)
	want = append(want[:2:2],
		"B seq=200104 [2026-01-04T00:00:00Z, 2026-01-05T00:00:00Z) current=false deleted name=b plan=p city=y visits=1",
		"B seq=200105 [2026-01-05T00:00:00Z, 2026-01-06T00:00:00Z) current=false name=b plan=p city=y visits=1")
	if dd := scdtest.DiffLines(want, got); dd != "" {
		t.Fatalf("switched back:\n%s", dd)
	}
	if strings.Contains(strings.Join(got, "\n"), "open") {
		t.Errorf("a version is still open: %v", got)
	}
	verifyClean(t, s, spec.Target)
}
