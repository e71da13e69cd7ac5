package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sequencer"
	"github.com/scd2sink/scd2sink/sink"
)

type recordingSink struct{ batches []sink.Batch }

func (r *recordingSink) Prepare(_ context.Context, b sink.Batch) (*sink.Prepared, error) {
	r.batches = append(r.batches, b)
	return nil, nil
}
func (r *recordingSink) ApplyPrepared(context.Context, *sink.Prepared) (sink.Result, error) {
	return sink.Result{}, nil
}
func (r *recordingSink) Offsets(context.Context) (map[change.Partition]int64, error) { return nil, nil }
func (r *recordingSink) Forget()                                                     {}
func (r *recordingSink) Anchors(context.Context) (map[change.Partition]change.Seq, error) {
	return nil, nil
}

// TestFlushBatches: splitting released events into batches of three, as
// flush does, each batch's commit points stay below every event not yet
// applied, and reach the end once all are.
func TestFlushBatches(t *testing.T) {
	p0, p1 := change.Partition{Topic: "t", Partition: 0}, change.Partition{Topic: "t", Partition: 1}
	rs := &recordingSink{}
	c := &Consumer{cfg: Config{BatchMaxEvents: 3}, sink: rs, m: NewMetrics(nil), health: &Health{},
		seq: sequencer.New(sequencer.Config{}, time.Now), anchors: newAnchors(),
		committed: map[change.Partition]int64{}, hwm: map[change.Partition]int64{}}
	for i := int64(0); i < 8; i++ {
		p := p0
		if i%2 == 1 {
			p = p1
		}
		ev := &change.Event{Table: "x", Key: []any{i}, Seq: change.MustSeq(i), Op: change.OpCreate,
			Origin: change.Origin{Partition: p, Offset: i / 2}}
		c.seq.Add(ev)
	}
	c.collect(c.seq.Flush())
	if len(c.pending) != 8 {
		t.Fatalf("pending %d", len(c.pending))
	}
	applied := map[change.Partition]int64{}
	for len(c.pending) > 0 {
		n := min(len(c.pending), 3)
		rest := c.pending[n:]
		offsets := c.commitPoints(rest)
		for _, ev := range c.pending[:n] {
			if ev.Origin.Offset+1 > applied[ev.Origin.Partition] {
				applied[ev.Origin.Partition] = ev.Origin.Offset + 1
			}
		}
		for _, ev := range rest {
			if offsets[ev.Origin.Partition] > ev.Origin.Offset {
				t.Fatalf("commit point %d of %s passes unapplied offset %d", offsets[ev.Origin.Partition], ev.Origin.Partition, ev.Origin.Offset)
			}
		}
		c.pending = rest
	}
	if got := c.commitPoints(nil); got[p0] != 4 || got[p1] != 4 {
		t.Fatalf("final commit points %v", got)
	}
}
