package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
)

// snapshotUntil lists, for a full snapshot's last read, the offsets every
// record of the snapshot is below (its topic's high watermarks). One try,
// within ctx: on an error the record waits and is read again.
func (c *Consumer) snapshotUntil(ctx context.Context, ev *change.Event) (sink.Snapshot, error) {
	topic := ev.Origin.Topic
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(c.client).ListEndOffsets(lctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return sink.Snapshot{}, fmt.Errorf("listing the end offsets of %s, where a full snapshot completed: %w", topic, err)
	}
	until := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { until[o.Partition] = o.Offset })
	if p := ev.Origin.Partition.Partition; until[p] <= ev.Origin.Offset {
		until[p] = ev.Origin.Offset + 1
	}
	return sink.Snapshot{Target: ev.Table, Seq: ev.Seq, At: ev.ValidFrom, Topic: topic, Until: until}, nil
}

// noteSnapshot remembers a completed full snapshot until the batch holding
// its last read. Called with mu held.
func (c *Consumer) noteSnapshot(ev *change.Event, snap sink.Snapshot) {
	if c.snaps == nil {
		c.snaps = map[*change.Event]sink.Snapshot{}
	}
	c.snaps[ev] = snap
	c.log.Info("a full snapshot completed", zap.String("topic", snap.Topic), zap.String("table", ev.Table),
		zap.Stringer("seq", ev.Seq), zap.Any("until", snap.Until))
}

// snapshotsIn lists the snapshots that events of a batch complete. They
// stay noted until forgetSnapshots, once the batch is handed over: a flush
// cut short (a rebalance while the applier's queue is full, a revoke's
// deadline, a failed prepare) leaves its events pending, and the batch
// that takes them later must carry the snapshots too, or the keys the
// snapshot did not read would never be closed.
func (c *Consumer) snapshotsIn(evs []*change.Event) []sink.Snapshot {
	if len(c.snaps) == 0 {
		return nil
	}
	var out []sink.Snapshot
	for _, ev := range evs {
		if sn, ok := c.snaps[ev]; ok {
			out = append(out, sn)
		}
	}
	return out
}

// forgetSnapshots forgets the snapshots that events of a batch handed
// over complete (its transaction records them).
func (c *Consumer) forgetSnapshots(evs []*change.Event, n int) {
	if n == 0 {
		return
	}
	for _, ev := range evs {
		delete(c.snaps, ev)
	}
}
