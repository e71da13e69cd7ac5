package consumer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/scd2sink/scd2sink/consumer/anchor"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sequencer"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestDeadLettersLoggedAndCounted: every dead letter a committed batch
// wrote is logged at warn with topic, partition, offset, target, reason
// and error, at most deadLogBurst a window, the number left out told with
// the next window's first line; the metric counts each by target and
// reason.
func TestDeadLettersLoggedAndCounted(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zapcore.WarnLevel)
	l := zap.New(core)
	m := NewMetrics(nil)
	d := deadLog{burst: 3, window: 200 * time.Millisecond}
	note := func(i int, reason string) sink.DeadNote {
		return sink.DeadNote{Origin: change.Origin{Partition: change.Partition{Topic: "shop.public.t", Partition: 2}, Offset: int64(i)},
			Table: "t_history", Reason: reason, Err: "value too long for type character varying(6)"}
	}
	var notes []sink.DeadNote
	for i := 0; i < 5; i++ {
		notes = append(notes, note(i, sink.ReasonRejected))
	}
	notes = append(notes, note(5, sink.ReasonDecode))
	m.record(sink.Result{DeadLetters: len(notes), Dead: notes})
	d.log(l, notes)
	if got := logs.Len(); got != 3 {
		t.Fatalf("%d lines logged in the first window, want 3", got)
	}
	first := logs.All()[0].ContextMap()
	for k, want := range map[string]any{"topic": "shop.public.t", "partition": int32(2), "offset": int64(0), "target": "t_history",
		"reason": "rejected", "error": "value too long for type character varying(6)"} {
		if first[k] != want {
			t.Errorf("field %s = %v, want %v", k, first[k], want)
		}
	}
	time.Sleep(250 * time.Millisecond)
	d.log(l, []sink.DeadNote{note(6, sink.ReasonConflict)})
	last := logs.All()[logs.Len()-1]
	if logs.Len() != 4 || last.ContextMap()["not_logged_before"] != int64(3) || !strings.Contains(last.Message, "dead-lettered") {
		t.Fatalf("after the window: %d lines, last %v", logs.Len(), last.ContextMap())
	}
	if got := testutil.ToFloat64(m.DeadLettered.WithLabelValues("t_history", "rejected")); got != 5 {
		t.Errorf("rejected counted %v, want 5", got)
	}
	if got := testutil.ToFloat64(m.DeadLettered.WithLabelValues("t_history", "decode")); got != 1 {
		t.Errorf("decode counted %v, want 1", got)
	}
}

// TestDeadLettersCountInBatchBytes: dead letters hold copies of their
// records; with batch_max_bytes they make a batch due like events do.
func TestDeadLettersCountInBatchBytes(t *testing.T) {
	t.Parallel()
	rs := &recordingSink{}
	c := &Consumer{cfg: Config{BatchMaxEvents: 1000, BatchMaxBytes: 3 << 20, BatchMaxWait: time.Hour, Classify: sink.Classify}, sink: rs, batches: rs, ledger: rs, marks: rs,
		m: NewMetrics(nil), log: zap.NewNop(), health: &Health{}, seq: sequencer.New(sequencer.Config{}, time.Now), anchors: anchor.New(),
		committed: map[change.Partition]int64{}, hwm: map[change.Partition]int64{}}
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c.client = cl
	c.applier = newApplier(c)
	go c.applier.run(context.Background())
	defer c.applier.stop()
	c.lastCommit = time.Now()
	big := make([]byte, 300<<10)
	for i := 0; i < 3; i++ { // 900 KiB: under a third of 3 MiB
		c.addDead(sink.DeadLetter{Origin: change.Origin{Partition: change.Partition{Topic: "t"}, Offset: int64(i)}, Value: big})
	}
	if err := c.maybeFlush(context.Background(), false); err != nil || len(rs.batches) != 0 {
		t.Fatalf("flushed %d batches (%v) under the bound", len(rs.batches), err)
	}
	c.addDead(sink.DeadLetter{Origin: change.Origin{Partition: change.Partition{Topic: "t"}, Offset: 3}, Value: big})
	if err := c.maybeFlush(context.Background(), false); err != nil || len(rs.batches) != 1 || len(rs.batches[0].DeadLetters) != 4 {
		t.Fatalf("flushed %d batches (%v) over the bound, want 1 with the 4 dead letters", len(rs.batches), err)
	}
}
