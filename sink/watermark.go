package sink

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
)

// The completeness watermark (DESIGN.md section 4): scd2sink_watermarks
// gives, per target, the time through which every event of its topic has
// been applied. Per partition that is the valid time of its last applied
// event (last_valid_from, written with the offsets in the batch's
// transaction), or, when the partition was fully applied at the last look
// at the log's end (caught_up_at, written by Watermark: the newest valid
// time its connector had written by then, see consumer/watermark.go) less
// the reorder window, whichever is later; a target's is the minimum over
// its partitions, NULL while any of them has neither. Rebuild groups'
// offsets are left out.

const watermarkView = "scd2sink_watermarks"

// watermarkNote marks the view's definition: it is replaced only when the
// window changes, so that a restart runs no DDL.
func watermarkNote(cfg *Config) string {
	return fmt.Sprintf("scd2sink watermarks v1: window %s", cfg.ReorderWindow)
}

// watermarkDDL creates or replaces the view when it is missing or stale.
func watermarkDDL(cat *catalog, cfg *Config) []string {
	note := watermarkNote(cfg)
	if cat.has(watermarkView) && cat.notes[watermarkView] == note {
		return nil
	}
	s := pgx.Identifier{cfg.Schema}.Sanitize()
	lit := func(v string) string { return "'" + strings.ReplaceAll(v, "'", "''") + "'" }
	return []string{
		fmt.Sprintf(`CREATE OR REPLACE VIEW %[1]s.%[2]s AS
			SELECT target, CASE WHEN bool_or(w IS NULL) THEN NULL ELSE min(w) END AS complete_through
			FROM (SELECT target, greatest(last_valid_from, caught_up_at - interval %[3]s) AS w
				FROM %[1]s.scd2sink_offsets WHERE target IS NOT NULL AND consumer_group NOT LIKE %[4]s) AS p
			GROUP BY target`, s, watermarkView, lit(fmt.Sprintf("%d microseconds", cfg.ReorderWindow.Microseconds())), lit(`%\_\_rebuild`)),
		fmt.Sprintf(`COMMENT ON VIEW %s.%s IS %s`, s, watermarkView, lit(note)),
	}
}

// Look is what the consumer saw of one assigned partition: the target its
// topic writes, the offset its reading began at, and the log's end offset
// at a time.
type Look struct {
	Target string
	From   int64
	End    int64
	At     time.Time
}

// Watermark records looks at the logs' ends: a partition whose recorded
// offset had reached the end is complete through the look's time (less
// the window); a partition with no row yet gets one at the offset its
// reading began (nothing applied: the target's watermark stays NULL until
// it is). It never moves an offset.
func (s *Sink) Watermark(ctx context.Context, looks map[change.Partition]Look) error {
	if len(looks) == 0 {
		return nil
	}
	var topics, targets []string
	var parts []int32
	var from, end []int64
	var at []time.Time
	for p, l := range looks {
		topics, parts, targets = append(topics, p.Topic), append(parts, p.Partition), append(targets, l.Target)
		from, end, at = append(from, l.From), append(end, l.End), append(at, l.At)
	}
	_, err := s.pool.Exec(ctx, fmt.Sprintf(`WITH x AS (
			SELECT * FROM unnest($2::text[], $3::int[], $4::text[], $5::bigint[], $6::bigint[], $7::timestamptz[]) AS x(t, p, g, f, e, a)),
		ins AS (INSERT INTO %[1]s.scd2sink_offsets (consumer_group, topic, partition, next_offset, target)
			SELECT $1, t, p, f, nullif(g, '') FROM x WHERE f >= 0 AND NOT EXISTS (SELECT FROM %[1]s.scd2sink_offsets AS o
				WHERE o.consumer_group = $1 AND o.topic = x.t AND o.partition = x.p) ON CONFLICT DO NOTHING)
		UPDATE %[1]s.scd2sink_offsets AS o SET caught_up_at = greatest(o.caught_up_at, x.a), target = coalesce(o.target, nullif(x.g, ''))
		FROM x WHERE o.consumer_group = $1 AND o.topic = x.t AND o.partition = x.p AND o.next_offset >= x.e`,
		pgx.Identifier{s.cfg.Schema}.Sanitize()), s.cfg.ConsumerGroup, topics, parts, targets, from, end, at)
	if err != nil {
		return fmt.Errorf("recording the watermark: %w", err)
	}
	return nil
}

// Watermarks returns scd2sink_watermarks: per target, the time through
// which it is complete (absent: not known yet).
func (s *Sink) Watermarks(ctx context.Context) (map[string]time.Time, error) {
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT target, complete_through FROM %s.%s WHERE complete_through IS NOT NULL`,
		pgx.Identifier{s.cfg.Schema}.Sanitize(), watermarkView))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", watermarkView, err)
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
