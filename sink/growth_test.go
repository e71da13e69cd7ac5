package sink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
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
// version rewritten.
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
							"type 1 current_version": "type1_current_ms", "late tracked": "late_ms"}[name]
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
