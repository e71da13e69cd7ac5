package sink_test

import (
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// A key's events whose sequence and valid time disagree are counted; a
// delete whose time stands in for the valid_from column it has no image
// of (source.ts_ms, whole seconds) is not, nor is a snapshot read.
func TestDisagreements(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		standIn bool
		want    int
	}{{"a delete earlier than the update before it", false, 1}, {"the same delete, its time source.ts_ms's", true, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			spec := sink.TableSpec{Target: "d_history", Keys: []string{"id"}}
			s := newSink(t, newPool(t), "public", spec)
			evs := []*change.Event{
				{Table: "d_history", Key: []any{"1"}, Seq: change.MustSeq(1), Op: change.OpCreate, ValidFrom: at.Add(300 * time.Millisecond), After: map[string]any{"id": "1", "v": "a"}},
				{Table: "d_history", Key: []any{"1"}, Seq: change.MustSeq(2), Op: change.OpUpdate, ValidFrom: at.Add(700 * time.Millisecond), After: map[string]any{"id": "1", "v": "b"}},
				{Table: "d_history", Key: []any{"1"}, Seq: change.MustSeq(3), Op: change.OpDelete, ValidFrom: at, TimeStandIn: tc.standIn},
			}
			res := apply(t, s, evs...)
			if got := res.Disagreements["d_history"]; got != tc.want {
				t.Errorf("disagreements %d, want %d (%+v)", got, tc.want, res.Disagree)
			}
		})
	}
}

// A late event whose valid time is before what the table already holds
// for its key (applied by an earlier batch) is noted with both real
// sequences: the stored event's and its own, never an empty one.
func TestDisagreementNamesStoredSequence(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	spec := sink.TableSpec{Target: "d_history", Keys: []string{"id"}}
	s := newSink(t, newPool(t), "public", spec)
	apply(t, s, &change.Event{Table: "d_history", Key: []any{"1"}, Seq: change.MustSeq(1), Op: change.OpCreate,
		ValidFrom: at.Add(700 * time.Millisecond), After: map[string]any{"id": "1", "v": "a"}})
	res := apply(t, s, &change.Event{Table: "d_history", Key: []any{"1"}, Seq: change.MustSeq(2), Op: change.OpUpdate,
		ValidFrom: at, After: map[string]any{"id": "1", "v": "b"}})
	if got := res.Disagreements["d_history"]; got != 1 {
		t.Fatalf("disagreements %d, want 1", got)
	}
	if len(res.Disagree) != 1 {
		t.Fatalf("notes %+v, want one", res.Disagree)
	}
	d := res.Disagree[0]
	if d.Seq.Compare(change.MustSeq(1)) != 0 || d.Later.Compare(change.MustSeq(2)) != 0 {
		t.Errorf("note names sequences %v and %v, want 1 and 2", d.Seq, d.Later)
	}
	if !d.T.Equal(at.Add(700*time.Millisecond)) || !d.LaterT.Equal(at) {
		t.Errorf("note times %v, %v", d.T, d.LaterT)
	}
}
