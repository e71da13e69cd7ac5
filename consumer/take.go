package consumer

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// A polled record's way into the sequencer (take), one step per function:
//
//  1. fetchErrors: the poll's errors — offsets out of range and data lost
//     by the broker are kept for the poll loop (resync.go), any other
//     marks Kafka unhealthy;
//  2. decodeAll: each record decoded without the lock, within
//     decodeBudget; a partition whose record must wait (the registry, a
//     snapshot's bookkeeping) is held back from that record on (waits.go);
//  3. notePositions: under the lock, each partition's high watermark and
//     next offset (where a held-back partition is read again);
//  4. sequence: each decoded record to the sequencer — a transaction
//     marker or a skipped record moves the commit point only, a record
//     that does not decode becomes a dead letter, an event is stamped
//     (receipt, stream time, snapshot, sequence anchor) and added.
//
// From the sequencer, released events collect into the pending batch
// (batch.go collect), which flush cuts, prepares (sink.Prepare) and hands
// to the applier (applier.go), which applies it in one transaction and
// then commits its offsets to Kafka.

// take decodes polled records into the sequencer.
func (c *Consumer) take(ctx context.Context, fetches kgo.Fetches) {
	// Once take is done nothing views a record's bytes: the decoder and
	// the dead letters copied what they keep. A compressed batch's buffer
	// goes back to the pool when all its records are recycled (pool.go).
	defer fetches.EachRecord(func(r *kgo.Record) { r.Recycle() })
	received := time.Now().UnixNano() // before decoding: its time counts towards the window
	fe := c.fetchErrors(fetches)
	if !fe.kafkaOK {
		c.health.Kafka.Store(false) // a broker's answers say it is not well; OnBrokerRead says when one answers
	}
	items, held := c.decodeAll(ctx, fetches)
	c.holdBack(held, items)

	c.mu.Lock()
	defer c.mu.Unlock()
	c.lost = append(c.lost, fe.lost...)
	for p, o := range fe.dataLoss {
		if c.dataLoss == nil {
			c.dataLoss = map[change.Partition]int64{}
		}
		c.dataLoss[p] = o
	}
	c.notePositions(fetches, held)
	if len(items) > 0 {
		c.lastRecord = time.Now() // after decoding, which may take a while: no poll has seen silence yet
	}
	c.sequence(items, received)
	c.noteBuffer()
}

// fetchFailures is what a poll's errors say.
type fetchFailures struct {
	kafkaOK  bool
	lost     []change.Partition         // offsets out of range: read again from what was applied
	dataLoss map[change.Partition]int64 // records the broker lost: where it reset to
}

// fetchErrors sorts a poll's errors (see fetchFailures); deadlines and
// cancellations are the poll's own and say nothing.
func (c *Consumer) fetchErrors(fetches kgo.Fetches) fetchFailures {
	fe := fetchFailures{kafkaOK: true}
	fetches.EachError(func(topic string, p int32, err error) {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return
		}
		if errors.Is(err, kerr.OffsetOutOfRange) {
			fe.lost = append(fe.lost, change.Partition{Topic: topic, Partition: p})
			return
		}
		var loss *kgo.ErrDataLoss
		if errors.As(err, &loss) {
			c.m.OffsetsLost.WithLabelValues(topic).Inc()
			c.log.Error("the broker lost records that may not have been applied (an unclean leader election); the history may miss their changes",
				zap.String("topic", topic), zap.Int32("partition", p), zap.Error(err))
			if loss.ResetTo >= 0 && loss.ResetTo < loss.ConsumedTo {
				if fe.dataLoss == nil {
					fe.dataLoss = map[change.Partition]int64{}
				}
				fe.dataLoss[change.Partition{Topic: topic, Partition: p}] = loss.ResetTo
			}
			return
		}
		fe.kafkaOK = false
		c.log.Warn("fetch error", zap.String("topic", topic), zap.Int32("partition", p), zap.Error(err))
	})
	return fe
}

// decodeAll decodes the polled records without the lock, within
// decodeBudget. A partition whose record must wait (debezium.ErrRetry, a
// snapshot's end not yet recorded) is held back from that record on: it
// is read again from there (waits.go).
func (c *Consumer) decodeAll(ctx context.Context, fetches kgo.Fetches) ([]decoded, map[change.Partition]heldBack) {
	dctx, cancel := context.WithTimeout(ctx, decodeBudget)
	defer cancel()
	items := make([]decoded, 0, fetches.NumRecords())
	held := map[change.Partition]heldBack{}
	var hdrs []debezium.Header
	fetches.EachRecord(func(r *kgo.Record) {
		o := change.Origin{Partition: change.Partition{Topic: r.Topic, Partition: r.Partition}, Offset: r.Offset}
		if _, ok := held[o.Partition]; ok {
			return
		}
		hdrs = hdrs[:0]
		for _, h := range r.Headers {
			hdrs = append(hdrs, debezium.Header{Key: h.Key, Value: h.Value})
		}
		it := decoded{o: o, rec: r}
		if r.Attrs.IsControl() {
			it.err = errControl
			items = append(items, it)
			return
		}
		it.ev, it.err = c.dec.Decode(dctx, o, r.Key, r.Value, hdrs...)
		if errors.Is(it.err, debezium.ErrRetry) {
			held[o.Partition] = heldBack{offset: o.Offset, why: it.err.Error()}
			return
		}
		if it.err == nil && it.ev.SnapshotEnd {
			snap, err := c.snapshotUntil(dctx, it.ev)
			if err != nil {
				held[o.Partition] = heldBack{offset: o.Offset, why: err.Error()}
				return
			}
			it.snap = &snap
		}
		items = append(items, it)
	})
	return items, held
}

// notePositions records each polled partition's high watermark and next
// offset to read (a held-back partition's: the record that waits), and
// the first offset read of it. Called with mu held.
func (c *Consumer) notePositions(fetches kgo.Fetches, held map[change.Partition]heldBack) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		part := change.Partition{Topic: p.Topic, Partition: p.Partition}
		c.hwm[part] = p.HighWatermark
		if n := len(p.Records); n > 0 {
			c.next[part] = p.Records[n-1].Offset + 1
			if h, ok := held[part]; ok {
				c.next[part] = h.offset
			}
			if _, ok := c.origin[part]; !ok {
				c.origin[part] = p.Records[0].Offset
			}
		}
	})
}

// sequence hands the decoded records to the sequencer in their order:
// markers and skipped records move the commit point only, records that
// did not decode become dead letters (logged at warn once their batch
// commits, deadLog), events are stamped and added. Called with mu held.
func (c *Consumer) sequence(items []decoded, received int64) {
	for _, it := range items {
		o, r := it.o, it.rec
		if it.err == errControl {
			c.seq.Skip(o)
			continue
		}
		c.m.Consumed.WithLabelValues(r.Topic).Inc()
		switch {
		case errors.Is(it.err, debezium.ErrSkip):
			c.seq.Skip(o)
		case it.err != nil:
			c.addDead(c.decodeLetter(o, r, it.err))
			c.seq.Skip(o)
		default:
			c.stamp(it, received)
			c.seq.Add(it.ev)
		}
	}
}

// decodeLetter is the dead letter of a record that did not decode: a
// copy of its bytes and headers (the record is recycled after take).
func (c *Consumer) decodeLetter(o change.Origin, r *kgo.Record, err error) sink.DeadLetter {
	dl := sink.DeadLetter{Origin: o, Key: bytes.Clone(r.Key), Value: bytes.Clone(r.Value), Err: err.Error(), Table: c.target(r.Topic),
		Reason: sink.ReasonDecode}
	for _, h := range r.Headers {
		dl.Headers = append(dl.Headers, sink.Header{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	return dl
}

// stamp notes what a decoded event tells before it is sequenced: when it
// was received, how far its stream's time has come, the snapshot it
// completes, and its sequence (a snapshot read without one is anchored
// to its partition's last seen sequence, package anchor). Called with mu held.
func (c *Consumer) stamp(it decoded, received int64) {
	ev := it.ev
	ev.Received = received
	if ev.Op != change.OpRead {
		// A snapshot read's time is when it was read, not when its row
		// changed: it says nothing of the stream's progress.
		c.noteValid(it.rec.Topic, ev.Source, ev.ValidFrom)
	}
	if it.snap != nil {
		c.noteSnapshot(ev, *it.snap)
	}
	if ev.Seq == nil {
		ev.Seq = c.anchors.Anchor(it.o)
	} else {
		c.anchors.See(it.o, ev.Seq)
	}
}

// errControl marks a transaction marker: skipped, never decoded or counted.
var errControl = errors.New("a transaction marker")

// decoded is one polled record, decoded outside the lock.
type decoded struct {
	o    change.Origin
	rec  *kgo.Record
	ev   *change.Event
	err  error
	snap *sink.Snapshot // a full snapshot that ev completes
}
