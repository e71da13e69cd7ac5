package sink_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// viewRows reads a query's rows as space-separated text.
func viewRows(t *testing.T, pool *pgxpool.Pool, q string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		var parts []string
		for _, v := range vals {
			switch x := v.(type) {
			case time.Time:
				if x.Hour() == 0 && x.Minute() == 0 && x.Second() == 0 && x.Nanosecond() == 0 && x.Location() == time.UTC {
					parts = append(parts, x.Format("2006-01-02"))
				} else {
					parts = append(parts, x.UTC().Format("2006-01-02T15:04:05.999999Z"))
				}
			case nil:
				parts = append(parts, "NULL")
			default:
				parts = append(parts, strings.TrimSpace(strings.ReplaceAll(toText(x), "\n", " ")))
			}
		}
		out = append(out, strings.Join(parts, " "))
	}
	return out
}

func toText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case bool:
		if x {
			return "true"
		}
		return "false"
	case int64:
		return itoa(int(x))
	}
	return "?"
}

// TestViews: the seed scenario's dimension in the Fabric guide's shape
// (surrogate key, dates, inclusive end, 9999-12-31 for current rows), the
// day grain in a time zone (the last version of each day), the timestamp
// grain with an inclusive end, and a column added later.
func TestViews(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	spec := custSpec("public")
	spec.Views = []sink.ViewSpec{
		{Name: "dim_customer", Day: true, TimeZone: "UTC", Inclusive: true, CurrentEnd: "9999-12-31",
			Columns: map[string]string{"scd_id": "CustomerKey", "customer_id": "CustomerID", "valid_from": "StartDate",
				"valid_to": "EndDate", "is_current": "IsCurrent", "plan": "Plan"}},
		{Name: "cust_daily_vienna", Day: true, TimeZone: "Europe/Vienna"},
		{Name: "cust_inclusive", Inclusive: true},
	}
	s := newSink(t, pool, "public", spec)
	apply(t, s, seedEvents()...)
	t.Run("Fabric dimension", func(t *testing.T) {
		got := viewRows(t, pool, `SELECT "CustomerID", "Plan", city, "StartDate", "EndDate", "IsCurrent" FROM dim_customer ORDER BY 1, 4`)
		want := []string{
			"C1001 basic Wien 2026-01-01 2026-02-28 false",
			"C1001 pro Wien 2026-03-01 9999-12-31 true",
			"C1002 pro Graz 2026-01-01 2026-02-28 false",
			"C1002 pro Linz 2026-03-01 9999-12-31 true",
			"C1003 basic Salzburg 2026-01-01 9999-12-31 true",
			"C1004 basic Wien 2026-03-01 9999-12-31 true",
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("dim_customer:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM dim_customer d JOIN customers_history h ON h.scd_id = d."CustomerKey"
			AND h.customer_id = d."CustomerID"`).Scan(&n); err != nil || n != 6 {
			t.Fatalf("CustomerKey is not scd_id: %d rows join (%v)", n, err)
		}
	})
	// C9: a version from 23:30 UTC (00:30 the next day in Vienna) to the
	// day after at 10:00; two on one day, of which only the last shows.
	at := func(s string) time.Time { v, _ := time.Parse(time.RFC3339, s); return v }
	apply(t, s,
		cust(change.OpCreate, 900, at("2026-04-01T23:30:00Z"), "C9", "name", "N", "plan", "a"),
		cust(change.OpUpdate, 901, at("2026-04-03T10:00:00Z"), "C9", "name", "N", "plan", "b"),
		cust(change.OpUpdate, 902, at("2026-04-03T15:00:00Z"), "C9", "name", "N", "plan", "c"),
	)
	t.Run("day grain in a time zone", func(t *testing.T) {
		got := viewRows(t, pool, `SELECT plan, valid_from, valid_to, is_current FROM cust_daily_vienna WHERE customer_id = 'C9' ORDER BY valid_from`)
		want := []string{"a 2026-04-02 2026-04-03 false", "c 2026-04-03 NULL true"}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("cust_daily_vienna:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
	t.Run("timestamp grain, inclusive end", func(t *testing.T) {
		got := viewRows(t, pool, `SELECT plan, valid_from, valid_to FROM cust_inclusive WHERE customer_id = 'C9' ORDER BY valid_from`)
		want := []string{"a 2026-04-01T23:30:00Z 2026-04-03T09:59:59.999999Z", "b 2026-04-03T10:00:00Z 2026-04-03T14:59:59.999999Z", "c 2026-04-03T15:00:00Z NULL"}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("cust_inclusive:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
	t.Run("a column added later", func(t *testing.T) {
		apply(t, s, cust(change.OpUpdate, 903, at("2026-04-04T00:00:00Z"), "C9", "name", "N", "plan", "c", "tier", "gold"))
		got := viewRows(t, pool, `SELECT tier FROM dim_customer WHERE "CustomerID" = 'C9' AND "IsCurrent"`)
		if strings.Join(got, "") != "gold" {
			t.Fatalf("tier %v", got)
		}
	})
}

// TestViewKeepsItsColumnOrder: a configured view whose columns are in
// another order than the table's (as rebuild's swap leaves it when the
// rebuilt table met its columns in another order) is replaced at the next
// start in its own order: CREATE OR REPLACE VIEW cannot reorder columns.
func TestViewKeepsItsColumnOrder(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	spec := custSpec("vieworder")
	spec.Views = []sink.ViewSpec{{Name: "dim", Columns: map[string]string{"plan": "Plan"}}}
	s := newSink(t, pool, "vieworder", spec)
	apply(t, s, cust(change.OpCreate, 1, date(1, 1), "K", "name", "a", "plan", "p", "city", "x", "visits", 1))
	if _, err := pool.Exec(context.Background(), `DROP VIEW vieworder.dim; CREATE VIEW vieworder.dim AS SELECT scd_id, valid_from,
		valid_to, is_current, city, "visits", plan AS "Plan", name, customer_id FROM vieworder.customers_history`); err != nil {
		t.Fatal(err)
	}
	s = newSink(t, pool, "vieworder", spec)
	apply(t, s, cust(change.OpUpdate, 2, date(1, 2), "K", "name", "a", "plan", "q", "city", "x", "visits", 1, "tier", "gold"))
	got := viewRows(t, pool, `SELECT "Plan", tier FROM vieworder.dim ORDER BY valid_from`)
	if strings.Join(got, ",") != "p gold,q gold" {
		t.Fatalf("dim: %v", got)
	}
}
