package consumer

import (
	"context"
	"encoding/base64"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// Lost offsets (DESIGN.md section 6). start_offset only places a group
// that has no offsets; a next offset that is no longer in the log —
// retention deleted records before they were applied, or the topic was
// deleted and re-created under the same name — follows OnOffsetLost:
//
//   - fail (the default) stops the service with an error naming topic,
//     partition and offsets: skipping or re-reading history is an
//     operator's choice;
//   - earliest goes on from the log's first offset, latest from its end;
//     either is logged as an error and counted in
//     scd2sink_offsets_lost_total.
//
// franz-go never resolves an out-of-range offset by itself here
// (NoResetOffset): it comes back as a fetch error for the partition. A
// re-created topic whose offsets still fall inside its new log is found by
// its topic ID, which scd2sink_offsets records beside the offsets.

// policy returns OnOffsetLost with its default.
func (c *Consumer) policy() string {
	if c.cfg.OnOffsetLost == "" {
		return "fail"
	}
	return c.cfg.OnOffsetLost
}

// offsetsLost handles the partitions whose next offset the last poll
// found out of range. It runs on the poll loop, where no rebalance can
// run (BlockRebalanceOnPoll), so seeking is safe.
func (c *Consumer) offsetsLost(ctx context.Context) error {
	c.mu.Lock()
	lost, dataLoss := c.lost, c.dataLoss
	c.lost, c.dataLoss = nil, nil
	if len(dataLoss) > 0 {
		// franz-go went on from where the log diverged: the records read
		// there are new. What was read past it is gone from Kafka (and is
		// in the history, or was in the buffer); the position moves back.
		c.rewindLocked(dataLoss, "the broker truncated the log under the reader (data loss)")
	}
	c.mu.Unlock()
	c.recordRewinds(ctx, dataLoss)
	if len(lost) == 0 {
		return nil
	}
	sort.Slice(lost, func(i, j int) bool {
		if lost[i].Topic != lost[j].Topic {
			return lost[i].Topic < lost[j].Topic
		}
		return lost[i].Partition < lost[j].Partition
	})
	topics := map[string]bool{}
	var names []string
	for _, p := range lost {
		if !topics[p.Topic] {
			topics[p.Topic] = true
			names = append(names, p.Topic)
		}
	}
	adm := kadm.NewClient(c.client)
	starts, err := adm.ListStartOffsets(ctx, names...)
	if err == nil {
		err = starts.Error()
	}
	var ends kadm.ListedOffsets
	if err == nil {
		if ends, err = adm.ListEndOffsets(ctx, names...); err == nil {
			err = ends.Error()
		}
	}
	if err != nil {
		// Kafka cannot say where the log is now: the partitions stay
		// failed and come back with the next poll.
		c.log.Warn("listing the log's offsets after an offset out of range; trying again", zap.Error(err))
		c.mu.Lock()
		c.lost = append(c.lost, lost...)
		c.mu.Unlock()
		return nil
	}
	var failures []string
	seek := map[change.Partition]int64{}
	back := map[change.Partition]int64{}
	c.mu.Lock()
	defer func() { c.recordRewinds(ctx, back) }() // after the unlock below
	defer c.mu.Unlock()
	for _, p := range lost {
		first, _ := starts.Lookup(p.Topic, p.Partition)
		end, _ := ends.Lookup(p.Topic, p.Partition)
		next, known := c.next[p]
		at := fmt.Sprintf("%d", next)
		if !known {
			at = "unknown"
		}
		desc := fmt.Sprintf("topic %s partition %d: the next offset to read (%s) is not in the log, which holds offsets %d to %d",
			p.Topic, p.Partition, at, first.Offset, end.Offset-1)
		c.m.OffsetsLost.WithLabelValues(p.Topic).Inc()
		if c.policy() == "fail" {
			failures = append(failures, desc)
			continue
		}
		to := first.Offset
		if c.policy() == "latest" {
			to = end.Offset
		}
		c.log.Error("offsets lost: "+desc+"; going on as kafka.on_offset_lost says (the history misses what the lost records changed)",
			zap.String("on_offset_lost", c.policy()), zap.Int64("resume_at", to))
		c.commitMu.Lock()
		applied, wasApplied := c.appliedTo[p]
		c.commitMu.Unlock()
		if (known && to < next) || (wasApplied && to < applied) {
			back[p] = to // the log now ends below where it was read
			continue
		}
		seek[p] = to
		c.next[p], c.origin[p] = to, to
		c.seq.Place(p, to) // the commit point moves there
	}
	c.seekTo(seek)
	if len(back) > 0 {
		c.rewindLocked(back, "the log ends below the offset to read (truncated by an unclean leader election)")
	}
	if len(failures) > 0 {
		return fmt.Errorf("offsets lost (kafka.on_offset_lost is fail): %s. Retention deleted records before they were applied, "+
			"or the topic was deleted and re-created; set kafka.on_offset_lost to earliest (go on from the log's first offset) "+
			"or latest (from its end) to continue without them", strings.Join(failures, "; "))
	}
	return nil
}

// checkTopicIDs compares the assigned topics' Kafka IDs with those recorded
// in scd2sink_offsets. A topic deleted and re-created under the same name
// has another ID: its stored offsets belong to the old log. Such a topic
// follows OnOffsetLost (fail stops the service through c.fatal); the
// returned set names the topics whose offsets it has placed. Called from
// adjustOffsets with mu held.
func (c *Consumer) checkTopicIDs(ctx context.Context, offsets map[string]map[int32]kgo.Offset, stored map[change.Partition]string) (placed map[string]bool, counts map[string]int32) {
	topics := make([]string, 0, len(offsets))
	for t := range offsets {
		topics = append(topics, t)
	}
	meta, err := kadm.NewClient(c.client).Metadata(ctx, topics...)
	if err != nil {
		c.log.Warn("reading the topics' IDs; a re-created topic goes unnoticed until its offsets fall out of range", zap.Error(err))
		return nil, nil
	}
	placed, counts = map[string]bool{}, map[string]int32{}
	for _, t := range topics {
		if d, ok := meta.Topics[t]; ok && d.Err == nil && len(d.Partitions) > 0 {
			counts[t] = int32(len(d.Partitions))
			for p := range offsets[t] {
				// A broker behind may still tell the old count.
				counts[t] = max(counts[t], p+1)
			}
		}
	}
	ids := make(map[string]string, len(c.topicIDs)+len(topics))
	for t, id := range c.topicIDs {
		ids[t] = id
	}
	defer func() { c.topicIDs = ids }() // copied on write: batches in flight hold the old map
	for _, t := range topics {
		d, ok := meta.Topics[t]
		if !ok || d.Err != nil || d.ID == (kadm.TopicID{}) {
			continue
		}
		id := base64.RawURLEncoding.EncodeToString(d.ID[:]) // as Kafka prints topic IDs
		was := ""
		for p := range offsets[t] {
			if w, ok := stored[change.Partition{Topic: t, Partition: p}]; ok && w != id {
				was = w
			}
		}
		if was == "" {
			ids[t] = id
			continue
		}
		c.m.OffsetsLost.WithLabelValues(t).Inc()
		desc := fmt.Sprintf("topic %s was deleted and re-created: its ID is %s, scd2sink_offsets holds offsets of topic ID %s", t, id, was)
		if c.policy() == "fail" {
			err := fmt.Errorf("offsets lost (kafka.on_offset_lost is fail): %s. Set kafka.on_offset_lost to earliest "+
				"(read the new topic from its start) or latest (from its end) to continue", desc)
			c.fatal.CompareAndSwap(nil, &err)
			continue
		}
		// The new log's bounds, exactly: the commit point moves there at
		// once, recorded with the new ID in place of the stale offsets.
		list := kadm.NewClient(c.client).ListStartOffsets
		if c.policy() == "latest" {
			list = kadm.NewClient(c.client).ListEndOffsets
		}
		bounds, err := list(ctx, t)
		if err == nil {
			err = bounds.Error()
		}
		if err != nil {
			err = fmt.Errorf("%s; listing its offsets to go on as kafka.on_offset_lost says: %w", desc, err)
			c.fatal.CompareAndSwap(nil, &err)
			continue
		}
		ids[t] = id // only once it goes on: a failed topic keeps its old ID, and fails again
		c.log.Error("offsets lost: "+desc+"; going on as kafka.on_offset_lost says", zap.String("on_offset_lost", c.policy()))
		for p := range offsets[t] {
			to, _ := bounds.Lookup(t, p)
			offsets[t][p] = kgo.NewOffset().At(to.Offset).WithEpoch(-1)
			part := change.Partition{Topic: t, Partition: p}
			c.next[part], c.origin[part] = to.Offset, to.Offset
			c.seq.Place(part, to.Offset) // recorded with the new ID at once, even at 0
		}
		placed[t] = true
	}
	return placed, counts
}

// rewindLocked places partitions back below where they were read or
// applied: the log they were read from was truncated. Batches not yet
// applied are abandoned and every partition is read again from its last
// applied offset (resync), these from the given ones; until a batch
// recording them is applied, their offsets replace the recorded ones
// (Position.Rewound), and no batch cut before may raise them again. Called
// on the poll loop with mu held.
func (c *Consumer) rewindLocked(to map[change.Partition]int64, why string) {
	c.commitMu.Lock()
	for p, o := range to {
		c.next[p], c.origin[p] = o, o
		c.rewound[p], c.appliedTo[p] = o, o
	}
	c.commitMu.Unlock()
	c.log.Warn("partitions placed back: "+why, zap.Any("to", to))
	c.requestResync(why)
}

// recordRewinds lowers the recorded offsets of rewound partitions at once,
// so that whoever reads them next (this member after a restart, another
// after a rebalance) starts there. It tries once, within rewindBudget: on
// failure the next batch of each partition records it (Position.Rewound).
func (c *Consumer) recordRewinds(ctx context.Context, to map[change.Partition]int64) {
	if len(to) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, rewindBudget)
	defer cancel()
	if err := c.ledger.Rewind(rctx, to); err != nil {
		c.log.Warn("recording the rewound offsets failed; the next batch records them", zap.Error(err))
	}
}

// rewindBudget bounds recordRewinds on the poll loop.
const rewindBudget = 5 * time.Second
