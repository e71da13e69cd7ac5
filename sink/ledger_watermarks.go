package sink

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/catalog"
)

// The completeness watermark (DESIGN.md section 4): scd2sink_watermarks
// gives, per target, the time through which every event of its topic has
// been applied. Per partition that is the later of the valid time of its
// last applied event (last_valid_from, written with the offsets in the
// batch's transaction; snapshot reads excluded, a microsecond less, never
// past the clock, reset when the topic is re-created) and, when the
// partition was fully applied at the last look at the log's end
// (scd2sink_progress.caught_up_at, written by Watermark: the newest valid
// time its connector had written by then, see consumer/watermark.go),
// less the reorder window (events within it may still come out of order);
// a target's is the minimum over every partition of its topic, NULL while
// any of them has neither. Rebuild groups are left out.

// Look is what the consumer saw of one partition of a topic it reads: the
// target the topic writes, the log's first and end offsets, and the time
// through which its connector had written everything (see
// consumer/watermark.go).
type Look struct {
	Target     string
	Start, End int64
	At         *time.Time // nil: not known; the partition is not counted as read to its end
	// TopicID is the topic's Kafka ID ("" unknown): offsets recorded for
	// another (a topic deleted and re-created) never count as its end.
	TopicID string
	// Connector names the connector that writes the topic ("" unknown),
	// kept so that a restart knows it before reading anything.
	Connector string
	// TransactionTopic is the transaction metadata topic of the topic's
	// table ("" none): the target's watermark goes no further than its
	// horizon (catalog/transactions.go).
	TransactionTopic string
}

// Watermark records looks at the logs' ends in scd2sink_progress: a
// partition whose recorded offset had reached the end (or whose log is
// empty and nothing recorded) is complete through the look's time, less
// the window in the view. Rows are written in key order (members looking
// at the same topics never deadlock) and only when they change.
func (l *Ledger) Watermark(ctx context.Context, looks map[change.Partition]Look) error {
	if len(looks) == 0 {
		return nil
	}
	keys := make([]change.Partition, 0, len(looks))
	for p := range looks {
		keys = append(keys, p)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Topic != keys[j].Topic {
			return keys[i].Topic < keys[j].Topic
		}
		return keys[i].Partition < keys[j].Partition
	})
	var topics, targets []string
	var parts []int32
	var start, end []int64
	var at []*time.Time
	var ids, conns, txns []string
	for _, p := range keys {
		l := looks[p]
		topics, parts, targets = append(topics, p.Topic), append(parts, p.Partition), append(targets, l.Target)
		start, end, at = append(start, l.Start), append(end, l.End), append(at, l.At)
		ids, conns, txns = append(ids, l.TopicID), append(conns, l.Connector), append(txns, l.TransactionTopic)
	}
	_, err := l.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s.%[2]s AS g (consumer_group, topic, partition, target, caught_up_at, connector, transaction_topic)
		SELECT $1, x.t, x.p, x.g, CASE WHEN coalesce(o.next_offset >= x.e AND (o.topic_id IS NULL OR x.id = '' OR o.topic_id = x.id), x.s >= x.e) THEN x.a END,
			nullif(x.c, ''), nullif(x.x, '')
		FROM unnest($2::text[], $3::int[], $4::text[], $5::bigint[], $6::bigint[], $7::timestamptz[], $8::text[], $9::text[], $10::text[])
			WITH ORDINALITY AS x(t, p, g, s, e, a, id, c, x, i)
		LEFT JOIN %[1]s.scd2sink_offsets AS o ON o.consumer_group = $1 AND o.topic = x.t AND o.partition = x.p
		ORDER BY x.i
		ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET target = excluded.target,
			caught_up_at = greatest(g.caught_up_at, excluded.caught_up_at), connector = coalesce(excluded.connector, g.connector),
			transaction_topic = excluded.transaction_topic
		WHERE g.target IS DISTINCT FROM excluded.target OR excluded.caught_up_at > g.caught_up_at
			OR (g.caught_up_at IS NULL AND excluded.caught_up_at IS NOT NULL)
			OR (excluded.connector IS NOT NULL AND g.connector IS DISTINCT FROM excluded.connector)
			OR g.transaction_topic IS DISTINCT FROM excluded.transaction_topic`,
		pgx.Identifier{l.schema}.Sanitize(), catalog.ProgressTable), l.group, topics, parts, targets, start, end, at, ids, conns, txns)
	if err != nil {
		return fmt.Errorf("recording the watermark: %w", err)
	}
	return nil
}

// Watermarks returns scd2sink_watermarks: per target, the time through
// which it is complete (absent: not known yet).
func (l *Ledger) Watermarks(ctx context.Context) (map[string]time.Time, error) {
	rows, err := l.pool.Query(ctx, fmt.Sprintf(`SELECT target, complete_through FROM %s.%s WHERE complete_through IS NOT NULL`,
		pgx.Identifier{l.schema}.Sanitize(), catalog.WatermarkView))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", catalog.WatermarkView, err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var target string
		var t time.Time
		if err := rows.Scan(&target, &t); err != nil {
			return nil, err
		}
		out[target] = t
	}
	return out, rows.Err()
}

// Connectors returns, per topic, the connector recorded by the looks
// (Look.Connector).
func (l *Ledger) Connectors(ctx context.Context) (map[string]string, error) {
	rows, err := l.pool.Query(ctx, fmt.Sprintf(`SELECT DISTINCT topic, connector FROM %s.%s WHERE consumer_group = $1 AND connector IS NOT NULL`,
		pgx.Identifier{l.schema}.Sanitize(), catalog.ProgressTable), l.group)
	if err != nil {
		return nil, fmt.Errorf("reading the connectors from %s: %w", catalog.ProgressTable, err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var topic, conn string
		if err := rows.Scan(&topic, &conn); err != nil {
			return nil, err
		}
		out[topic] = conn
	}
	return out, rows.Err()
}
