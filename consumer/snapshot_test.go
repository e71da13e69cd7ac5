package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/consumer/anchor"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sequencer"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// failingSink fails the first Prepare it is asked for.
type failingSink struct {
	recordingSink
	failed bool
}

func (f *failingSink) Prepare(ctx context.Context, b sink.Batch) (*sink.Prepared, error) {
	if !f.failed {
		f.failed = true
		return nil, errors.New("cut short")
	}
	return f.recordingSink.Prepare(ctx, b)
}

// TestSnapshotSurvivesCutFlush: the batch that finally carries a full
// snapshot's last read carries the snapshot too, when an earlier flush of
// the same events was cut short before it was handed over; without it the
// keys the snapshot did not read would never be closed.
func TestSnapshotSurvivesCutFlush(t *testing.T) {
	t.Parallel()
	fs := &failingSink{}
	c := &Consumer{cfg: Config{BatchMaxEvents: 10, BatchMaxBytes: 64 << 20, BatchMaxWait: time.Hour, Classify: sink.Classify},
		sink: fs, batches: fs, ledger: fs, marks: fs, m: NewMetrics(nil), log: zap.NewNop(), health: &Health{}, seq: sequencer.New(sequencer.Config{}, time.Now),
		anchors: anchor.New(), committed: map[change.Partition]int64{}, hwm: map[change.Partition]int64{}}
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
	last := &change.Event{Table: "x", Key: []any{int64(2)}, Seq: change.MustSeq(5), Op: change.OpRead, SnapshotEnd: true,
		Origin: change.Origin{Partition: p, Offset: 1}}
	c.seq.Add(&change.Event{Table: "x", Key: []any{int64(1)}, Seq: change.MustSeq(5), Op: change.OpRead, Origin: change.Origin{Partition: p}})
	c.seq.Add(last)
	snap := sink.Snapshot{Target: "x", Seq: last.Seq, Topic: "t", Until: map[int32]int64{0: 2}}
	c.noteSnapshot(last, snap)
	c.collect(c.seq.Flush())
	if err := c.flush(context.Background(), nil); err == nil {
		t.Fatal("the first flush did not fail")
	}
	if len(c.pending) != 2 {
		t.Fatalf("%d events pending after the cut flush, want 2", len(c.pending))
	}
	if err := c.flushAndWait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(fs.batches) != 1 || len(fs.batches[0].Snapshots) != 1 || fs.batches[0].Snapshots[0].Seq.String() != snap.Seq.String() {
		t.Fatalf("batches %+v: want one carrying the snapshot", fs.batches)
	}
	if len(c.snaps) != 0 {
		t.Fatalf("%d snapshots still noted after the batch was handed over", len(c.snaps))
	}
}
