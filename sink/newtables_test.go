package sink_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// TestManyNewTablesInNewSchema: a batch that meets a dozen tables for the
// first time, in a schema that does not exist yet, creates them all (their
// DDL runs side by side, the schema once) and applies every one's rows.
func TestManyNewTablesInNewSchema(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	const n = 12
	var specs []sink.TableSpec
	var evs []*change.Event
	for i := range n {
		target := fmt.Sprintf("t%02d_history", i)
		specs = append(specs, sink.TableSpec{Target: target, Schema: "landing", Keys: []string{"id"}})
		for k := range 3 {
			evs = append(evs, &change.Event{Table: target, Key: []any{fmt.Sprint(k)}, Seq: change.MustSeq(int64(k + 1)), Op: change.OpCreate, ValidFrom: day,
				After:  map[string]any{"id": fmt.Sprint(k), "name": fmt.Sprintf("n%d", i)},
				Origin: change.Origin{Partition: change.Partition{Topic: "src." + target}, Offset: int64(k)}})
		}
	}
	s := newSink(t, pool, "public", specs...)
	res := apply(t, s, evs...)
	if res.VersionsOpened != n*3 {
		t.Errorf("%d versions opened, want %d", res.VersionsOpened, n*3)
	}
	for _, spec := range specs {
		var rows int
		if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM landing.%s WHERE is_current`, spec.Target)).Scan(&rows); err != nil {
			t.Fatalf("%s: %v", spec.Target, err)
		}
		if rows != 3 {
			t.Errorf("%s: %d current versions, want 3", spec.Target, rows)
		}
	}
}
