package consumer

import (
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sequencer"
)

// TestQuietTargets: a target counts as quiet only when no record has come
// for quietAfter, something is buffered, and every assigned partition of
// its topic is read to its end (a fetch's high watermark or a look's end,
// whichever is further; an unread partition only when its log is empty).
// One topic behind holds back its own target only; quiet_after 0 (a
// negative QuietAfter) turns it off.
func TestQuietTargets(t *testing.T) {
	a0, a1 := change.Partition{Topic: "src.a", Partition: 0}, change.Partition{Topic: "src.a", Partition: 1}
	b0 := change.Partition{Topic: "src.b", Partition: 0}
	now := time.Now()
	type state struct {
		next   map[change.Partition]int64
		hwm    map[change.Partition]int64
		looked map[change.Partition]logBounds
	}
	read := state{next: map[change.Partition]int64{a0: 10, a1: 5, b0: 7}, hwm: map[change.Partition]int64{a0: 10, a1: 5, b0: 7}}
	for _, tc := range []struct {
		name  string
		st    state
		since time.Duration // since the last record
		quiet time.Duration // Config.QuietAfter
		want  []string
	}{
		{"all read to their ends, quiet long enough", read, time.Second, 0, []string{"a_history", "b_history"}},
		{"records came lately", read, 100 * time.Millisecond, 0, nil},
		{"turned off", read, time.Second, -1, nil},
		{"its own quiet_after", read, 150 * time.Millisecond, 100 * time.Millisecond, []string{"a_history", "b_history"}},
		{"one partition of a behind", state{next: map[change.Partition]int64{a0: 10, a1: 4, b0: 7}, hwm: read.hwm}, time.Second, 0, []string{"b_history"}},
		{"a look saw more than the last fetch", state{next: read.next, hwm: read.hwm,
			looked: map[change.Partition]logBounds{b0: {start: 0, end: 9}}}, time.Second, 0, []string{"a_history"}},
		{"an unread partition with an empty log", state{next: map[change.Partition]int64{a0: 10, a1: 5}, hwm: map[change.Partition]int64{a0: 10, a1: 5},
			looked: map[change.Partition]logBounds{b0: {start: 3, end: 3}}}, time.Second, 0, []string{"a_history", "b_history"}},
		{"an unread partition with records", state{next: map[change.Partition]int64{a0: 10, a1: 5}, hwm: map[change.Partition]int64{a0: 10, a1: 5},
			looked: map[change.Partition]logBounds{b0: {start: 3, end: 4}}}, time.Second, 0, []string{"a_history"}},
		{"an unread partition never looked at", state{next: map[change.Partition]int64{a0: 10, a1: 5}, hwm: map[change.Partition]int64{a0: 10, a1: 5}}, time.Second, 0, []string{"a_history"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec := debezium.New([]debezium.Rule{{Topic: "src.a", Target: "a_history"}, {Topic: "src.b", Target: "b_history"}}, nil, nil)
			c := &Consumer{cfg: Config{ReorderWindow: 2 * time.Second, QuietAfter: tc.quiet}, dec: dec,
				seq:      sequencer.New(sequencer.Config{ReorderWindow: 2 * time.Second}, time.Now),
				assigned: map[change.Partition]bool{a0: true, a1: true, b0: true},
				next:     tc.st.next, hwm: tc.st.hwm, looked: tc.st.looked, lastRecord: now.Add(-tc.since)}
			if c.hwm == nil {
				c.hwm = map[change.Partition]int64{}
			}
			c.seq.Add(&change.Event{Table: "a_history", Key: []any{"k"}, Seq: change.MustSeq(1), Op: change.OpUpdate, Origin: change.Origin{Partition: a0, Offset: 9}})
			got := c.quietTargets(now)
			if len(got) != len(tc.want) {
				t.Fatalf("quiet %v, want %v", got, tc.want)
			}
			for _, w := range tc.want {
				if !got[w] {
					t.Fatalf("quiet %v, want %v", got, tc.want)
				}
			}
		})
	}
}
