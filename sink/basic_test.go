package sink_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

var day = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func custSpec(schema string) sink.TableSpec {
	return sink.TableSpec{
		Target: "customers_history", Schema: schema, Keys: []string{"customer_id"},
		Columns: []sink.Column{{Name: "customer_id", Type: "text"}, {Name: "name", Type: "text"},
			{Name: "plan", Type: "text"}, {Name: "city", Type: "text"}, {Name: "visits", Type: "bigint"}},
		TrackHistory: []string{"plan", "city"},
	}
}

var custCols = []string{"name", "plan", "city", "visits"}

func cust(op change.Op, seq int64, at time.Time, id string, kv ...any) *change.Event {
	ev := &change.Event{Table: "customers_history", Key: []any{id}, Seq: change.MustSeq(seq), Op: op, ValidFrom: at,
		Origin: change.Origin{Partition: change.Partition{Topic: "shop.public.customers"}, Offset: seq}}
	if op.HasAfter() {
		ev.After = map[string]any{"customer_id": id}
		for i := 0; i+1 < len(kv); i += 2 {
			v := kv[i+1]
			if n, ok := v.(int); ok {
				v = json.Number(itoa(n))
			}
			ev.After[kv[i].(string)] = v
		}
	}
	return ev
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestAppendAndLate(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	spec := custSpec("public")
	s := newSink(t, pool, "public", spec)
	evs := []*change.Event{
		cust(change.OpRead, 10, day, "C1", "name", "Sarah", "plan", "basic", "city", "Wien", "visits", 1),
		cust(change.OpUpdate, 20, day.AddDate(0, 1, 0), "C1", "name", "Sarah", "plan", "pro", "city", "Wien", "visits", 2),
		cust(change.OpUpdate, 40, day.AddDate(0, 3, 0), "C1", "name", "Sara", "plan", "pro", "city", "Linz", "visits", 3),
	}
	apply(t, s, evs[0], evs[1])
	apply(t, s, evs[2])
	late := cust(change.OpDelete, 30, day.AddDate(0, 2, 0), "C1")
	apply(t, s, late)
	apply(t, s, evs[1]) // redelivered
	all := append(evs, late)
	want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, all))
	got := scdtest.HistoryLines(t, pool, spec, custCols)
	if d := scdtest.DiffLines(want, got); d != "" {
		t.Fatalf("history differs from the fold:\n%s", d)
	}
	verifyClean(t, s, spec.Target)
}
