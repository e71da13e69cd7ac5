package sink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// BenchmarkGrowth measures how the cost of one event grows with the
// versions its key already has (10, 1,000, 50,000), for what touches
// them: a tracked change at the end (one version closed, one opened), a
// Type 1 change under type1_scope all_versions (every version rewritten)
// and under current_version (one), and a late tracked change in the
// middle of the key's history (one version split). Each is applied alone,
// as a batch of one event, reps times on keys of the same length; it
// reports milliseconds per event and, for all_versions, microseconds per
// version rewritten. Late changes come mid-history and near the end (a
// late event's repair reads the key's history from the version before it).
func BenchmarkGrowth(b *testing.B) {
	pool := benchPool(b)
	ctx := context.Background()
	const keys = 3 // reps: one event of each kind per key
	for _, versions := range []int{10, 1_000, 50_000} {
		b.Run(fmt.Sprintf("versions=%d", versions), func(b *testing.B) {
			for iter := 0; iter < b.N; iter++ {
				for _, scope := range []sink.Type1Scope{sink.AllVersions, sink.CurrentVersion} {
					schema := fmt.Sprintf("growth_%d_%s_%d", versions, scope, iter)
					spec := benchSpec(schema)
					spec.Type1Scope = scope
					s, err := sink.New(sink.Config{Schema: schema, Tables: []sink.TableSpec{spec}}, pool)
					if err != nil {
						b.Fatal(err)
					}
					if err := s.Init(ctx); err != nil {
						b.Fatal(err)
					}
					at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
					ev := func(k, seq int, plan, name string, score int) *change.Event {
						return &change.Event{Table: spec.Target, Key: []any{json.Number(strconv.Itoa(k))}, Seq: change.MustSeq(int64(seq)),
							Op: change.OpUpdate, ValidFrom: at.Add(time.Duration(seq) * time.Second),
							After: map[string]any{"id": json.Number(strconv.Itoa(k)), "name": name, "plan": plan, "city": "Wien", "score": json.Number(strconv.Itoa(score))}}
					}
					// Each key gets its versions: tracked changes, seqs 10 apart
					// (room for late events between them).
					var batch []*change.Event
					for k := 0; k < keys; k++ {
						for v := 0; v < versions; v++ {
							batch = append(batch, ev(k, 10*(v+1), "basic", "customer", v))
							if len(batch) == benchBatch {
								if _, err := s.Apply(ctx, sink.Batch{Events: batch}); err != nil {
									b.Fatal(err)
								}
								batch = nil
							}
						}
					}
					if _, err := s.Apply(ctx, sink.Batch{Events: batch}); err != nil {
						b.Fatal(err)
					}
					end := 10 * (versions + 1)
					kinds := []struct {
						name string
						ev   func(k int) *change.Event
					}{
						{"tracked at the end", func(k int) *change.Event { return ev(k, end+1, "pro", "customer", -1) }},
						{"type 1", func(k int) *change.Event { return ev(k, end+2, "pro", "renamed", -1) }},
						{"late tracked", func(k int) *change.Event { return ev(k, 10*(versions/2)+5, "team", "customer", -2) }},
						{"late tracked near the end", func(k int) *change.Event { return ev(k, 10*versions-5, "team", "customer", -3) }},
					}
					if scope == sink.CurrentVersion {
						kinds = kinds[1:2]
					}
					for _, kind := range kinds {
						b.StartTimer()
						start := time.Now()
						for k := 0; k < keys; k++ {
							if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{kind.ev(k)}}); err != nil {
								b.Fatal(err)
							}
						}
						per := time.Since(start) / keys
						b.StopTimer()
						name := kind.name
						if kind.name == "type 1" {
							name = "type 1 " + string(scope)
						}
						unit := map[string]string{"tracked at the end": "tracked_ms", "type 1 all_versions": "type1_all_ms",
							"type 1 current_version": "type1_current_ms", "late tracked": "late_mid_ms", "late tracked near the end": "late_end_ms"}[name]
						b.ReportMetric(float64(per.Microseconds())/1000, unit)
						if name == "type 1 all_versions" {
							b.ReportMetric(float64(per.Nanoseconds())/1000/float64(versions), "type1_all_us/version")
						}
						b.Logf("%d versions per key, %s: %.2f ms per event", versions, name, float64(per.Microseconds())/1000)
					}
					vs, err := s.Verify(ctx, spec.Target)
					if err != nil || len(vs) > 0 {
						b.Fatalf("verify: %v %v", err, vs)
					}
				}
			}
		})
	}
}

// TestLateEventReadsFromItsVersion: a late event's repair reads the key's
// history from the version before the one live at its sequence, not the
// whole of it, and stays exact: a late Type 1 change that is the key's
// last row (a delete came after it) gives every version its name under
// all_versions, those not read too, and the repair audit lists them all;
// under current_version only the versions it belongs to.
func TestLateEventReadsFromItsVersion(t *testing.T) {
	for _, scope := range []sink.Type1Scope{sink.AllVersions, sink.CurrentVersion} {
		t.Run(string(scope), func(t *testing.T) {
			pool := newPool(t)
			ctx := context.Background()
			spec := custSpec("public")
			spec.Type1Scope = scope
			s := newSink(t, pool, "public", spec)
			h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
			applied := []*change.Event{
				cust(change.OpCreate, 10, h(1), "A", "name", "Ann", "plan", "basic"),
				cust(change.OpUpdate, 20, h(2), "A", "name", "Ann", "plan", "pro"),
				cust(change.OpUpdate, 30, h(3), "A", "name", "Ann", "plan", "team"),
				cust(change.OpUpdate, 35, h(4), "A", "name", "Ann", "plan", "enterprise"),
				cust(change.OpDelete, 50, h(6), "A"),
			}
			if _, err := s.Apply(ctx, sink.Batch{Events: applied}); err != nil {
				t.Fatal(err)
			}
			late := cust(change.OpUpdate, 40, h(5), "A", "name", "Sarah", "plan", "enterprise")
			if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{late}}); err != nil {
				t.Fatal(err)
			}
			all := append(applied, late)
			want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, all))
			if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
				t.Fatalf("history differs from the fold:\n%s", d)
			}
			verifyClean(t, s, spec.Target)
			// The audit lists every version the repair changed, those not
			// read too: under all_versions all four get the new name.
			if scope == sink.AllVersions {
				var before, after, omitted int
				if err := pool.QueryRow(ctx, `SELECT jsonb_array_length(before), jsonb_array_length(after), omitted FROM customers_history_scd_repairs`).Scan(&before, &after, &omitted); err != nil {
					t.Fatal(err)
				}
				if before != 4 || after != 4 || omitted != 0 {
					t.Errorf("audit: %d versions before, %d after, %d omitted; want 4, 4, 0", before, after, omitted)
				}
			}
		})
	}
}
