package sink

import (
	"context"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"

	"github.com/scd2sink/scd2sink/sink/catalog"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// Partitions added to a topic (kafka-topics --alter --partitions). Kafka
// places a key by its hash modulo the partition count, so after a resize a
// key's new events go to another partition than its old ones: two members
// may then hold events of one key, and the partition locks and the
// partition-keyed fence no longer keep them apart. scd2sink_topics
// records each topic's partition count as first seen; a member that is
// assigned a partition of a topic that has more partitions now records
// the resize (NotePartitions), in a transaction that takes every
// partition lock of the topic, so that it waits for the writers still
// applying under the old count. From then on every writer of the topic
// takes its topic lock too (after its partition locks, in a statement
// whose snapshot sees the resize: fence), so they take turns, and the
// fence compares the offsets of all of the topic's partitions, so that a
// writer forgets what it remembers of the topic's keys once another wrote
// through any partition. The history stays exact; the cost is that the
// members' transactions on a resized topic no longer overlap. A topic
// resized before the first start of a version that records the counts is
// not recognised (its count is taken as the original one).

// partitionLock is the advisory lock key of a partition of the consumer
// group (partition -1: the whole topic's).
func (l *Ledger) partitionLock(topic string, partition int32) int64 {
	return partitionLockOf(l.group, topic, partition)
}

// partitionLockOf is the advisory lock key of a partition of a group.
func partitionLockOf(group, topic string, partition int32) int64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "scd2sink\x00%s\x00%s\x00%d", group, topic, partition)
	return int64(h.Sum64())
}

// NotePartitions records the topics' partition counts (as the consumer
// sees them when partitions are assigned); a count higher than recorded
// marks the topic resized, once every writer that applies under the old
// count has committed. It returns the topics it found resized now.
func (l *Ledger) NotePartitions(ctx context.Context, counts map[string]int32) ([]string, error) {
	sch := pgx.Identifier{l.schema}.Sanitize()
	topics := make([]string, 0, len(counts))
	for t := range counts {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	var resized []string
	for _, topic := range topics {
		n := counts[topic]
		var was int32
		var marked bool
		err := l.pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %s.%s AS r (consumer_group, topic, partitions) VALUES ($1, $2, $3)
			ON CONFLICT (consumer_group, topic) DO UPDATE SET partitions = r.partitions
			RETURNING partitions, resized_at IS NOT NULL`, sch, catalog.TopicsTable), l.group, topic, n).Scan(&was, &marked)
		if err != nil {
			return resized, fmt.Errorf("recording the partitions of %s: %w", topic, err)
		}
		if n <= was {
			continue
		}
		locks := make([]int64, n)
		for p := int32(0); p < n; p++ {
			locks[p] = l.partitionLock(topic, p)
		}
		err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
			// In partition order, as every batch's fence takes them.
			if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT k FROM unnest($1::bigint[]) WITH ORDINALITY AS x(k, o) ORDER BY o) l`, locks); err != nil {
				return fmt.Errorf("waiting for the writers of %s: %w", topic, err)
			}
			_, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s.%s SET partitions = greatest(partitions, $3), resized_at = coalesce(resized_at, now())
				WHERE consumer_group = $1 AND topic = $2`, sch, catalog.TopicsTable), l.group, topic, n)
			return err
		})
		if err != nil {
			return resized, fmt.Errorf("recording that %s has more partitions: %w", topic, err)
		}
		resized = append(resized, topic)
		if !marked {
			l.log.Warn("partitions were added to a topic: its keys move between partitions, so its writers take turns from now on (the history stays exact)",
				zap.String("topic", topic), zap.Int32("partitions_before", was), zap.Int32("partitions", n))
		}
	}
	return resized, nil
}

// errTopicGrown is a batch's fence finding a partition beyond a topic's
// recorded count that is not marked resized (the assignment could not
// record it): applyOne records the resize and applies the batch again.
type errTopicGrown struct {
	topics []string
	names  []string // the batch's topics, sorted
	max    []int32  // their highest partition in the batch
}

func (e *errTopicGrown) Error() string {
	return fmt.Sprintf("partitions were added to %s and the resize is not recorded yet", strings.Join(e.topics, ", "))
}

// counts are the partition counts the batch shows for the grown topics.
func (e *errTopicGrown) counts() map[string]int32 {
	out := map[string]int32{}
	for _, t := range e.topics {
		for i, n := range e.names {
			if n == t {
				out[t] = e.max[i] + 1
			}
		}
	}
	return out
}
