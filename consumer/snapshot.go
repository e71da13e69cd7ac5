package consumer

import (
	"context"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
)

// noteSnapshot records that ev, the last read of a full snapshot, completes
// it: the batch that applies ev carries the snapshot, with the offsets every
// record of it lies below — each partition's end offset now, when its last
// record has been read (Debezium wrote the others before it). The sink
// reconciles it once every partition of the topic is applied that far.
// Called with mu held; it waits while Kafka cannot list the offsets, and
// returns an error only when ctx ends first: then ev must not be applied
// (its partition stops below it, and a restart reads it again).
func (c *Consumer) noteSnapshot(ctx context.Context, ev *change.Event) error {
	topic := ev.Origin.Topic
	adm := kadm.NewClient(c.client)
	backoff := 100 * time.Millisecond
	for {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ends, err := adm.ListEndOffsets(lctx, topic)
		cancel()
		if err == nil {
			err = ends.Error()
		}
		if err == nil {
			until := map[int32]int64{}
			ends.Each(func(o kadm.ListedOffset) { until[o.Partition] = o.Offset })
			if p := ev.Origin.Partition.Partition; until[p] <= ev.Origin.Offset {
				until[p] = ev.Origin.Offset + 1
			}
			if c.snaps == nil {
				c.snaps = map[*change.Event]sink.Snapshot{}
			}
			c.snaps[ev] = sink.Snapshot{Target: ev.Table, Seq: ev.Seq, At: ev.ValidFrom, Topic: topic, Until: until}
			c.log.Info("a full snapshot completed", zap.String("topic", topic), zap.String("table", ev.Table),
				zap.Stringer("seq", ev.Seq), zap.Any("until", until))
			return nil
		}
		if ctx.Err() != nil {
			c.log.Warn("a full snapshot completed but its topic's offsets could not be listed before shutdown; its last read is read again after the restart",
				zap.String("topic", topic), zap.Error(err))
			return ctx.Err()
		}
		c.log.Warn("listing the end offsets of a snapshot's topic; retrying", zap.String("topic", topic), zap.Error(err))
		time.Sleep(backoff)
		backoff = min(2*backoff, 5*time.Second)
	}
}

// snapshotsIn takes the snapshots that events of a batch complete.
func (c *Consumer) snapshotsIn(evs []*change.Event) []sink.Snapshot {
	if len(c.snaps) == 0 {
		return nil
	}
	var out []sink.Snapshot
	for _, ev := range evs {
		if sn, ok := c.snaps[ev]; ok {
			out = append(out, sn)
			delete(c.snaps, ev)
		}
	}
	return out
}
