package sink_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// TestRepairAudit: every late repair writes one row to
// <target>_scd_repairs in the batch's transaction, with the key, the late
// event's sequence and the versions the repair changed, before and after
// (team, untouched, is in neither); appends write none.
func TestRepairAudit(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	s := newSink(t, pool, "public", custSpec("public"))
	h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
	res := apply(t, s,
		cust(change.OpCreate, 10, h(10), "A", "name", "Ann", "plan", "basic"),
		cust(change.OpUpdate, 30, h(30), "A", "name", "Ann", "plan", "team"),
		cust(change.OpCreate, 11, h(11), "B", "name", "Bob", "plan", "basic"),
	)
	if res.Repaired != 0 {
		t.Fatalf("appends repaired %d keys", res.Repaired)
	}
	// Late: A's plan was pro between h(20) and h(30); B unchanged (append).
	res = apply(t, s,
		cust(change.OpUpdate, 20, h(20), "A", "name", "Ann", "plan", "pro"),
		cust(change.OpUpdate, 40, h(40), "B", "name", "Bob", "plan", "pro"),
	)
	if res.Repaired != 1 {
		t.Fatalf("%d keys repaired, want 1", res.Repaired)
	}
	type row struct {
		Plan      string  `json:"plan"`
		ValidFrom string  `json:"valid_from"`
		ValidTo   *string `json:"valid_to"`
	}
	var key string
	var cause []byte
	var before, after []row
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) OVER (), key::text, cause_seq, before, after FROM customers_history_scd_repairs`).Scan(&n, &key, &cause, &before, &after); err != nil {
		t.Fatal(err)
	}
	plans := func(rs []row) (out []string) {
		for _, r := range rs {
			to := "-"
			if r.ValidTo != nil {
				to = *r.ValidTo
			}
			out = append(out, r.Plan+" "+r.ValidFrom+" "+to)
		}
		return out
	}
	wantBefore := []string{"basic 2026-01-01T10:00:00+00:00 2026-01-02T06:00:00+00:00"}
	wantAfter := []string{"basic 2026-01-01T10:00:00+00:00 2026-01-01T20:00:00+00:00", "pro 2026-01-01T20:00:00+00:00 2026-01-02T06:00:00+00:00"}
	if n != 1 || key != `{"customer_id": "A"}` || change.Seq(cause).Compare(change.MustSeq(20)) != 0 {
		t.Fatalf("%d rows; key %s, cause %s", n, key, change.Seq(cause))
	}
	if got, _ := json.Marshal(plans(before)); string(got) != mustJSON(wantBefore) {
		t.Fatalf("before %s, want %s", got, mustJSON(wantBefore))
	}
	if got, _ := json.Marshal(plans(after)); string(got) != mustJSON(wantAfter) {
		t.Fatalf("after %s, want %s", got, mustJSON(wantAfter))
	}
	// A replayed late event is a duplicate: no repair, no row.
	if res = apply(t, s, cust(change.OpUpdate, 20, h(20), "A", "name", "Ann", "plan", "pro")); res.Repaired != 0 || res.Duplicates != 1 {
		t.Fatalf("replay: %+v", res)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM customers_history_scd_repairs`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d audit rows after the replay (%v)", n, err)
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

// TestRepairReadsLittleOfTheSideTable: a late event reads the part of its
// key's history it can change (the version live at its sequence, up to the
// first version it cannot move), not the key's whole side table: here 1,000
// versions and 1,000 side rows (Type 1 changes between them), and a late
// tracked change in the middle and one before everything.
func TestRepairReadsLittleOfTheSideTable(t *testing.T) {
	t.Parallel()
	const pairs = 1000
	pool := sharedPool(t)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		lateSeq int64 // between two events: seqs are 10 apart
	}{{"in the middle", 10*pairs + 5}, {"before everything", 5}} {
		t.Run(tc.name, func(t *testing.T) {
			schema := "side_read_" + strings.ReplaceAll(tc.name, " ", "_")
			s := newSink(t, pool, schema, custSpec(schema))
			var evs []*change.Event
			plans := []string{"basic", "pro"}
			for i := range 2 * pairs {
				op := change.OpUpdate
				if i == 0 {
					op = change.OpCreate
				}
				// Even events change the plan (a version), odd ones the visits (a side row).
				evs = append(evs, cust(op, int64(10*(i+1)), start.Add(time.Duration(i)*time.Minute), "K",
					"name", "Kim", "plan", plans[(i/2)%2], "city", "Wien", "visits", i/2+i%2))
			}
			apply(t, s, evs...)
			late := cust(change.OpUpdate, tc.lateSeq, start.Add(time.Duration(tc.lateSeq/10)*time.Minute-30*time.Second), "K",
				"name", "Kim", "plan", "team", "city", "Wien", "visits", 7)
			res := apply(t, s, late)
			t.Logf("late event at sequence %d: read %d versions and %d side rows of %d and %d", tc.lateSeq,
				res.RepairVersionsRead, res.RepairSideRowsRead, pairs, pairs)
			if res.Repaired != 1 {
				t.Fatalf("%d keys repaired", res.Repaired)
			}
			if res.RepairVersionsRead == 0 || res.RepairVersionsRead > 4 || res.RepairSideRowsRead > 4 {
				t.Errorf("the repair read %d versions and %d side rows, want at most 4 of each", res.RepairVersionsRead, res.RepairSideRowsRead)
			}
			verifyClean(t, s, "customers_history")
		})
	}
}
