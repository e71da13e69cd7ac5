package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/consumer/anchor"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sequencer"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

type recordingSink struct{ batches []sink.Batch }

func (r *recordingSink) Prepare(_ context.Context, b sink.Batch) (*sink.Prepared, error) {
	r.batches = append(r.batches, b)
	return nil, nil
}
func (r *recordingSink) ApplyPrepared(context.Context, *sink.Prepared) (sink.Result, error) {
	return sink.Result{}, nil
}
func (r *recordingSink) Offsets(context.Context) (map[change.Partition]int64, error)     { return nil, nil }
func (r *recordingSink) Forget()                                                         {}
func (r *recordingSink) Rewind(context.Context, map[change.Partition]int64) error        { return nil }
func (r *recordingSink) Watermark(context.Context, map[change.Partition]sink.Look) error { return nil }
func (r *recordingSink) Watermarks(context.Context) (map[string]time.Time, error)        { return nil, nil }
func (r *recordingSink) Reconcile(context.Context) error                                 { return nil }
func (r *recordingSink) ApplyPart(context.Context, *sink.Prepared) (sink.Result, error) {
	return sink.Result{}, nil
}
func (r *recordingSink) HistoryTables(context.Context, []string) (map[string]bool, error) {
	return nil, nil
}
func (r *recordingSink) Connectors(context.Context) (map[string]string, error) { return nil, nil }
func (r *recordingSink) TopicIDs(context.Context) (map[change.Partition]string, error) {
	return nil, nil
}
func (r *recordingSink) Anchors(context.Context) (map[change.Partition]change.Seq, error) {
	return nil, nil
}

// TestFlushBatches: splitting released events into batches of three, as
// flush does, each batch's commit points stay below every event not yet
// applied, and reach the end once all are.
func TestFlushBatches(t *testing.T) {
	t.Parallel()
	p0, p1 := change.Partition{Topic: "t", Partition: 0}, change.Partition{Topic: "t", Partition: 1}
	rs := &recordingSink{}
	c := &Consumer{cfg: Config{BatchMaxEvents: 3}, sink: rs, batches: rs, ledger: rs, marks: rs, m: NewMetrics(nil), health: &Health{},
		seq: sequencer.New(sequencer.Config{}, time.Now), anchors: anchor.New(),
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

// TestBatchesCutByBytes: events waiting for the applier are bounded by
// BatchMaxBytes, not only by count: big events are cut into batches of at
// most a third of it (one event at least), a full half is due at once, and
// every event is handed over exactly once.
func TestBatchesCutByBytes(t *testing.T) {
	t.Parallel()
	big := make([]byte, 100<<10) // 100 KiB row images
	for _, tc := range []struct {
		name      string
		maxBytes  int64
		wantSizes []int
	}{
		{"1 MiB: three per batch", 1 << 20, []int{3, 3, 3, 3, 3, 3, 2}},
		{"tiny: one per batch", 1 << 10, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
		{"large: by count", 64 << 20, []int{10, 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := &recordingSink{}
			c := &Consumer{cfg: Config{BatchMaxEvents: 10, BatchMaxBytes: tc.maxBytes, BatchMaxWait: time.Hour}, sink: rs, batches: rs, ledger: rs, marks: rs, m: NewMetrics(nil), log: zap.NewNop(),
				health: &Health{}, seq: sequencer.New(sequencer.Config{}, time.Now), anchors: anchor.New(),
				committed: map[change.Partition]int64{}, hwm: map[change.Partition]int64{}}
			cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1")) // no group: commits fail at once, harmlessly
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			c.client = cl
			c.applier = newApplier(c)
			go c.applier.run(context.Background())
			defer c.applier.stop()
			p := change.Partition{Topic: "t"}
			for i := int64(0); i < 20; i++ {
				c.seq.Add(&change.Event{Table: "x", Key: []any{i}, Seq: change.MustSeq(i), Op: change.OpCreate,
					AfterJSON: big, Origin: change.Origin{Partition: p, Offset: i}})
			}
			c.collect(c.seq.Flush())
			if c.pendBytes < 20*int64(len(big)) {
				t.Fatalf("pending bytes %d", c.pendBytes)
			}
			if err := c.maybeFlush(context.Background(), false); err != nil { // due by bytes (or count), not by age
				t.Fatal(err)
			}
			if err := c.flushAndWait(context.Background()); err != nil {
				t.Fatal(err)
			}
			var sizes []int
			seen := map[int64]bool{}
			for _, b := range rs.batches {
				if len(b.Events) > 0 {
					sizes = append(sizes, len(b.Events))
				}
				for _, ev := range b.Events {
					if seen[ev.Origin.Offset] {
						t.Fatalf("offset %d handed over twice", ev.Origin.Offset)
					}
					seen[ev.Origin.Offset] = true
				}
			}
			if fmt.Sprint(sizes) != fmt.Sprint(tc.wantSizes) || len(seen) != 20 || c.pendBytes != 0 {
				t.Errorf("batches of %v events (%d events, %d bytes left), want %v", sizes, len(seen), c.pendBytes, tc.wantSizes)
			}
		})
	}
}
