package consumer

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

func partitions(m map[string][]int32) []change.Partition {
	var out []change.Partition
	for t, ps := range m {
		for _, p := range ps {
			out = append(out, change.Partition{Topic: t, Partition: p})
		}
	}
	return out
}

// onAssigned: the sink's memory of keys may be stale (another member may
// have written them); the group is joined.
func (c *Consumer) onAssigned(ctx context.Context, _ *kgo.Client, assigned map[string][]int32) {
	if !c.awaitClient(ctx) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// The poll loop may have handed a batch over between allowing the
	// rebalance and this callback: the sink's memory is not forgotten
	// under a batch being applied.
	c.applier.cancelProbes()
	if !c.applier.idle() {
		wctx, cancel := context.WithTimeout(ctx, c.cfg.revokeBudget)
		if err := c.applier.waitCtx(wctx); errors.Is(err, context.DeadlineExceeded) {
			c.requestResync("an assignment waited " + c.cfg.revokeBudget.String() + " for a batch in flight")
			c.awaitAbandoned(ctx)
		}
		cancel()
	}
	c.ledger.Forget()
	c.health.Joined.Store(true)
	c.log.Info("partitions assigned", zap.Any("partitions", assigned))
	c.skipUnroutable(ctx, assigned)
}

// ErrIgnored is what Config.Route returns for a topic that is nobody's
// data (Debezium's transaction metadata or schema changes that a
// pattern's regular expression took): paused without an error.
var ErrIgnored = errors.New("not a table's topic")

// ErrUnsettled is what Config.Route returns when it cannot answer yet
// (PostgreSQL, which records which topic writes a target, is away): the
// topic is paused and asked about again every second.
var ErrUnsettled = errors.New("cannot tell yet whether the topic can be applied")

// routeBudget bounds one Config.Route call.
const routeBudget = 5 * time.Second

// skipUnroutable pauses the assigned topics that cannot be applied (two
// patterns match, or their target is another topic's): logged once and
// counted; their offsets stay where they were, so that a corrected
// configuration reads them from there. Called with mu held.
func (c *Consumer) skipUnroutable(ctx context.Context, assigned map[string][]int32) {
	if c.cfg.Route == nil {
		return
	}
	// One budget for all the topics: a PostgreSQL that does not answer
	// must not hold the rebalance for a budget per topic. Once one topic
	// could not be settled, the rest wait for settle unasked.
	rctx, cancel := context.WithTimeout(ctx, routeBudget)
	defer cancel()
	unsure := false
	for topic := range assigned {
		if unsure {
			c.routed(topic, fmt.Errorf("%w: an earlier topic's answer did not come in time", ErrUnsettled))
			continue
		}
		if !c.routed(topic, c.cfg.Route(rctx, topic)) {
			unsure = true
		}
	}
}

func (c *Consumer) askRoute(ctx context.Context, topic string) error {
	rctx, cancel := context.WithTimeout(ctx, routeBudget)
	defer cancel()
	return c.cfg.Route(rctx, topic)
}

// routed pauses topic unless Route's answer err lets it be applied, and
// reports whether the answer is settled. Called with mu held.
func (c *Consumer) routed(topic string, err error) bool {
	if err == nil {
		// A pause outlives the assignment (franz-go keeps paused topics
		// until resumed): a topic paused before, as unsettled or
		// skipped, is resumed now that it can be applied.
		if c.unsettled[topic] || c.skipped[topic] {
			delete(c.unsettled, topic)
			delete(c.skipped, topic)
			c.client.ResumeFetchTopics(topic)
			c.log.Info("topic resumed: it can be applied", zap.String("topic", topic))
		}
		return true
	}
	c.client.PauseFetchTopics(topic)
	switch {
	case errors.Is(err, ErrUnsettled):
		if c.unsettled == nil {
			c.unsettled = map[string]bool{}
		}
		if !c.unsettled[topic] {
			c.unsettled[topic] = true
			c.log.Warn("topic paused until it is known whether it can be applied", zap.String("topic", topic), zap.Error(err))
		}
		return false
	case c.skipped[topic]:
	case errors.Is(err, ErrIgnored):
		c.log.Info("topic paused: Debezium's or Kafka's own, never applied", zap.String("topic", topic))
	default:
		c.m.TopicsSkipped.WithLabelValues(topic).Inc()
		c.log.Error("topic skipped: it cannot be applied; its partitions are paused and nothing of it is committed",
			zap.String("topic", topic), zap.Error(err))
	}
	if c.skipped == nil {
		c.skipped = map[string]bool{}
	}
	c.skipped[topic] = true
	return true
}

// settle asks again about the unsettled topics still assigned (without
// holding mu while asking), resuming those that can be applied now.
func (c *Consumer) settle(ctx context.Context) {
	c.mu.Lock()
	var topics []string
	for topic := range c.unsettled {
		if c.holds(topic) {
			topics = append(topics, topic)
		}
	}
	c.mu.Unlock()
	for _, topic := range topics {
		err := c.askRoute(ctx, topic)
		c.mu.Lock()
		// A topic no longer assigned stays unsettled (and paused) until
		// it is assigned again and Route answers.
		if c.unsettled[topic] && c.holds(topic) && c.routed(topic, err) {
			delete(c.unsettled, topic)
		}
		c.mu.Unlock()
	}
}

// holds reports whether a partition of topic is assigned. Called with mu
// held.
func (c *Consumer) holds(topic string) bool {
	for p := range c.assigned {
		if p.Topic == topic {
			return true
		}
	}
	return false
}

// adjustOffsets resumes each assigned partition from scd2sink_offsets
// whenever it differs from the group's committed offset (DESIGN.md section
// 6: progress lives in PostgreSQL). Ahead is the common case (a crash
// between the PostgreSQL commit and the Kafka commit); behind means the
// target was restored from a backup, or the offsets table restored older:
// resuming from Kafka's offset would skip history the target no longer
// has, so the partition is read again from what the target holds (the fold
// is idempotent: a replay costs time), with a warning. A partition the
// target has no offset for although Kafka has one and its history table
// exists (the offsets table emptied or dropped) follows OnOffsetLost
// (lostProgress).
func (c *Consumer) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	if !c.awaitClient(ctx) {
		return offsets, ctx.Err()
	}
	applied, err := c.ledger.Offsets(ctx)
	if err != nil {
		c.log.Warn("reading scd2sink_offsets; resuming from Kafka's offsets", zap.Error(err))
		return offsets, nil
	}
	anchors, err := c.ledger.Anchors(ctx)
	if err != nil {
		c.log.Warn("reading scd2sink_offsets' anchors", zap.Error(err))
	}
	storedIDs, err := c.ledger.TopicIDs(ctx)
	if err != nil {
		c.log.Warn("reading the topic IDs in scd2sink_offsets", zap.Error(err))
	}
	c.lostProgress(ctx, offsets, applied)
	c.mu.Lock()
	defer c.mu.Unlock()
	placed, counts := c.checkTopicIDs(ctx, offsets, storedIDs)
	c.notePartitions(ctx, counts)
	defer func() {
		// Resuming where scd2sink_offsets stands, the recorded anchor holds.
		for topic, parts := range offsets {
			for p, off := range parts {
				part := change.Partition{Topic: topic, Partition: p}
				c.assigned[part] = true
				if at := off.EpochOffset().Offset; at >= 0 {
					c.next[part], c.origin[part] = at, at
				}
				if placed[topic] {
					continue
				}
				if at, ok := applied[part]; ok && anchors[part] != nil && off.EpochOffset().Offset == at {
					c.anchors.Resume(part, at, anchors[part])
				}
			}
		}
	}()
	for topic, parts := range offsets {
		if placed[topic] {
			continue // re-created: the recorded offsets belong to the old log
		}
		for p, off := range parts {
			at, ok := applied[change.Partition{Topic: topic, Partition: p}]
			if !ok {
				continue
			}
			kafka := off.EpochOffset().Offset
			switch {
			case kafka < 0 || at > kafka:
				c.log.Info("resuming from scd2sink_offsets", zap.String("topic", topic), zap.Int32("partition", p),
					zap.Int64("offset", at), zap.Int64("kafka_offset", kafka))
				if kafka >= 0 {
					c.m.OffsetsDiffer.WithLabelValues(topic, "ahead").Inc()
				}
			case at < kafka:
				c.m.OffsetsDiffer.WithLabelValues(topic, "behind").Inc()
				c.log.Warn("scd2sink_offsets is behind Kafka's committed offset (the target restored from a backup?): "+
					"reading the partition again from what the target holds, so that no history is skipped",
					zap.String("topic", topic), zap.Int32("partition", p), zap.Int64("offset", at), zap.Int64("kafka_offset", kafka),
					zap.Int64("records_replayed", kafka-at))
			default:
				continue
			}
			parts[p] = kgo.NewOffset().At(at).WithEpoch(-1)
		}
	}
	return offsets, nil
}

// lostProgress finds the assigned partitions that Kafka has a committed
// offset for, scd2sink_offsets none, and whose target's history table
// exists: the target's record of its progress is gone (the offsets table
// emptied, dropped, or restored older than the table), so Kafka's offset
// cannot be trusted to be below what the table holds. OnOffsetLost says
// what to do: fail (the default) stops the service naming them; earliest
// reads them again from the log's start (exact, the fold is idempotent);
// latest goes on from Kafka's committed offset (what the table may miss is
// lost). A partition that has never been applied has neither offset; a
// Kafka offset at or below the log's start skips nothing and is taken.
func (c *Consumer) lostProgress(ctx context.Context, offsets map[string]map[int32]kgo.Offset, applied map[change.Partition]int64) {
	var topics []string
	targets := map[string]string{}
	for topic, parts := range offsets {
		for p, off := range parts {
			if _, ok := applied[change.Partition{Topic: topic, Partition: p}]; ok || off.EpochOffset().Offset < 0 {
				continue
			}
			if target := c.target(topic); target != "" && targets[topic] == "" {
				targets[topic] = target
				topics = append(topics, topic)
			}
		}
	}
	if len(topics) == 0 {
		return
	}
	names := make([]string, 0, len(topics))
	for _, t := range topics {
		names = append(names, targets[t])
	}
	hctx, hcancel := context.WithTimeout(ctx, routeBudget) // a rebalance callback: bounded
	exists, err := c.ledger.HistoryTables(hctx, names)
	hcancel()
	if err != nil {
		c.log.Warn("looking for the history tables of partitions scd2sink_offsets has no offset for; resuming from Kafka's offsets", zap.Error(err))
		return
	}
	sort.Strings(topics)
	// Kafka's offset at or below the log's start skips nothing: reading
	// from there is reading everything.
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	starts, serr := kadm.NewClient(c.client).ListStartOffsets(lctx, topics...)
	cancel()
	var failures []string
	for _, topic := range topics {
		if !exists[targets[topic]] {
			continue
		}
		parts := offsets[topic]
		nums := make([]int32, 0, len(parts))
		for p, off := range parts {
			if _, ok := applied[change.Partition{Topic: topic, Partition: p}]; !ok && off.EpochOffset().Offset >= 0 {
				nums = append(nums, p)
			}
		}
		sort.Slice(nums, func(i, j int) bool { return nums[i] < nums[j] })
		for _, p := range nums {
			kafka := parts[p].EpochOffset().Offset
			if first, ok := starts.Lookup(topic, p); kafka == 0 || (serr == nil && ok && first.Err == nil && kafka <= first.Offset) {
				continue
			}
			c.m.OffsetsLost.WithLabelValues(topic).Inc()
			c.m.OffsetsDiffer.WithLabelValues(topic, "missing").Inc()
			desc := fmt.Sprintf("topic %s partition %d: Kafka's committed offset is %d, scd2sink_offsets has none, and history table %s exists",
				topic, p, kafka, targets[topic])
			switch c.policy() {
			case "fail":
				failures = append(failures, desc)
			case "earliest":
				c.log.Error("progress lost: "+desc+"; reading the partition again from the log's start (kafka.on_offset_lost: earliest)",
					zap.String("topic", topic), zap.Int32("partition", p), zap.Int64("kafka_offset", kafka))
				parts[p] = kgo.NewOffset().AtStart()
			default:
				c.log.Error("progress lost: "+desc+"; going on from Kafka's committed offset (kafka.on_offset_lost: latest): "+
					"what the table misses below it stays missing",
					zap.String("topic", topic), zap.Int32("partition", p), zap.Int64("kafka_offset", kafka))
			}
		}
	}
	if len(failures) > 0 {
		err := fmt.Errorf("progress lost (kafka.on_offset_lost is fail): %s. scd2sink_offsets was emptied, dropped or restored "+
			"older than the history tables, so Kafka's offsets may be past what they hold; set kafka.on_offset_lost to earliest "+
			"(read the partitions again from the log's start: exact, takes time) or latest (trust Kafka's offsets)",
			strings.Join(failures, "; "))
		c.fatal.CompareAndSwap(nil, &err)
	}
}

// onRevoked applies what was fetched from the revoked partitions and
// commits it before they go to another member, waiting at most
// revokeBudget: past it, what is in flight is abandoned and the revoked
// partitions are left to their next owner (resync.go).
func (c *Consumer) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	if !c.awaitClient(ctx) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applier.cancelProbes()
	parts := partitions(revoked)
	var err error
	if c.fatal.Load() != nil {
		err = errors.New("the service is stopping on an error: nothing more is applied")
	} else {
		c.collect(c.seq.FlushPartitions(parts))
		wctx, cancel := context.WithTimeout(ctx, c.cfg.revokeBudget)
		err = c.flushAndWait(wctx)
		cancel()
	}
	if err != nil {
		// Not applied in time: abandon it, the next owner reads it again
		// (and the partitions kept are read again by the poll loop).
		c.log.Warn("applying revoked partitions did not finish; leaving them to the next owner", zap.Error(err))
		if !c.applier.idle() {
			c.requestResync("a revoke waited " + c.cfg.revokeBudget.String() + " for batches in flight")
			c.awaitAbandoned(ctx)
		}
		c.dropPending(parts)
	}
	c.seq.DropPartitions(parts)
	c.anchors.Drop(parts)
	c.forgetCommitted(parts)
	c.ledger.Forget()
	c.log.Info("partitions revoked", zap.Any("partitions", revoked))
}

// onLost drops everything fetched from lost partitions without committing:
// another member may already own them. What is in flight is abandoned (a
// batch about to commit would also fail its membership check).
func (c *Consumer) onLost(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	if !c.awaitClient(ctx) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	parts := partitions(lost)
	c.applier.cancelProbes()
	if !c.applier.idle() {
		c.requestResync("partitions lost")
		c.awaitAbandoned(ctx)
	}
	c.seq.DropPartitions(parts)
	c.anchors.Drop(parts)
	c.dropPending(parts)
	c.forgetCommitted(parts)
	c.ledger.Forget()
	c.health.Joined.Store(false)
	c.log.Warn("partitions lost", zap.Any("partitions", lost))
}

// awaitAbandoned waits, at most revokeBudget, for abandoned batches to
// leave the applier (a cancelled statement returns promptly).
func (c *Consumer) awaitAbandoned(ctx context.Context) {
	wctx, cancel := context.WithTimeout(ctx, c.cfg.revokeBudget)
	defer cancel()
	if err := c.applier.waitCtx(wctx); errors.Is(err, context.DeadlineExceeded) {
		c.log.Warn("an abandoned batch has not returned yet; it cannot commit (its membership check fails)")
	}
}

func (c *Consumer) forgetCommitted(parts []change.Partition) {
	c.releaseHeld(parts)
	c.releaseParked(parts)
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	for _, p := range parts {
		delete(c.committed, p)
		delete(c.appliedTo, p)
		delete(c.rewound, p)
		delete(c.next, p) // next and origin: guarded by mu, held by every caller
		delete(c.origin, p)
		delete(c.assigned, p)
		delete(c.hwm, p)    // a partition assigned back reads its end again
		delete(c.looked, p) // (quiet.go)
	}
}

// dropPending removes pending events and dead letters of parts.
func (c *Consumer) dropPending(parts []change.Partition) {
	set := map[change.Partition]bool{}
	for _, p := range parts {
		set[p] = true
	}
	evs := c.pending[:0]
	for _, ev := range c.pending {
		if !set[ev.Origin.Partition] {
			evs = append(evs, ev)
		}
	}
	c.pending = evs
	c.pendBytes = 0
	for _, ev := range evs {
		c.pendBytes += int64(ev.Size())
	}
	dead := c.dead[:0]
	for _, d := range c.dead {
		if !set[d.Origin.Partition] {
			dead = append(dead, d)
		}
	}
	c.dead = dead
}

// notePartitions records the assigned topics' partition counts, so that a
// topic whose partitions were added to is written by one member at a time
// (sink/resize.go). It is bounded like the rest of an assignment; a
// failure is logged and tried again at the next assignment. Called with mu
// held, from adjustOffsets.
func (c *Consumer) notePartitions(ctx context.Context, counts map[string]int32) {
	np, ok := c.sink.(interface {
		NotePartitions(context.Context, map[string]int32) ([]string, error)
	})
	if !ok || len(counts) == 0 {
		return
	}
	nctx, cancel := context.WithTimeout(ctx, c.cfg.revokeBudget)
	defer cancel()
	if _, err := np.NotePartitions(nctx, counts); err != nil {
		c.log.Error("recording the topics' partition counts failed; if partitions were added, two members may write a key at once until it succeeds (tried again at the next assignment)",
			zap.Error(err))
	}
}
