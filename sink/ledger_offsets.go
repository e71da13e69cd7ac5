package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/plan"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
)

// fence serialises writers of the batch's partitions (a transaction-scoped
// advisory lock per partition, taken in a fixed order) and empties the
// cache if another writer applied one of them since this Sink did.
//
// It also sets the transaction's planner options (options: keyedPlans or
// genericPlans): the three statements go to PostgreSQL as one pipeline,
// one round trip.
func (l *Ledger) fence(ctx context.Context, tx pgx.Tx, options string, offsets map[change.Partition]Position, lock []change.Partition) error {
	if len(offsets) == 0 && len(lock) == 0 {
		if _, err := tx.Exec(ctx, options); err != nil {
			return fmt.Errorf("setting the batch's planner options: %w", err)
		}
		return nil
	}
	parts := make([]change.Partition, 0, len(offsets)+len(lock))
	for p := range offsets {
		parts = append(parts, p)
	}
	for _, p := range lock {
		if _, ok := offsets[p]; !ok {
			parts = append(parts, p)
		}
	}
	sort.Slice(parts, func(i, j int) bool {
		if parts[i].Topic != parts[j].Topic {
			return parts[i].Topic < parts[j].Topic
		}
		return parts[i].Partition < parts[j].Partition
	})
	locks := make([]int64, len(parts))
	topics := make([]string, len(parts))
	nums := make([]int32, len(parts))
	var tnames []string
	var tlocks []int64
	var tmax []int32 // per topic, the batch's highest partition
	for i, p := range parts {
		locks[i] = l.partitionLock(p.Topic, p.Partition)
		topics[i], nums[i] = p.Topic, p.Partition
		if len(tnames) == 0 || tnames[len(tnames)-1] != p.Topic { // parts are sorted by topic
			tnames, tlocks, tmax = append(tnames, p.Topic), append(tlocks, l.partitionLock(p.Topic, -1)), append(tmax, p.Partition)
		}
		tmax[len(tmax)-1] = p.Partition
	}
	b := &pgx.Batch{}
	b.Queue(options)
	b.Queue(`SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT k FROM unnest($1::bigint[]) WITH ORDINALITY AS x(k, o) ORDER BY o) l`, locks)
	// Topics whose partitions were added to (ledger_topics.go): keys moved
	// between partitions, so writers of the topic take turns, after the
	// partition locks (one order for all) and in a statement of its own,
	// whose snapshot sees a resize recorded while it waited.
	// A partition beyond the recorded count, on a topic not marked
	// resized yet (its assignment could not record it), is reported: the
	// batch records the resize first (errTopicGrown, applyOne).
	b.Queue(fmt.Sprintf(`SELECT coalesce(string_agg(t, ',') FILTER (WHERE g), ''), coalesce(string_agg(t, ',') FILTER (WHERE rz), ''),
			count(pg_advisory_xact_lock(k)) FILTER (WHERE rz)
		FROM (SELECT x.k, x.t, r.resized_at IS NOT NULL AS rz, coalesce(r.resized_at IS NULL AND x.m >= r.partitions, false) AS g
			FROM unnest($1::bigint[], $2::text[], $4::int[]) WITH ORDINALITY AS x(k, t, m, o)
			LEFT JOIN %s.%s r ON r.consumer_group = $3 AND r.topic = x.t ORDER BY x.o) l`,
		pgx.Identifier{l.schema}.Sanitize(), catalog.TopicsTable), tlocks, tnames, l.group, tmax)
	// With the offsets, the number of reconciled snapshots: a new one
	// closed keys behind every writer's back (reconcile.go). For a
	// resized topic, every partition's offset: a key may have been
	// written through another member's partition. Each partition's row
	// is looked up by its key (a subquery per partition): a join let the
	// planner, on statistics taken while the table was small, filter
	// every row against every partition (30 ms at 800 partitions).
	// OFFSET 0 keeps the subquery whole, so each lookup runs once.
	b.Queue(fmt.Sprintf(`SELECT o.topic, o.partition, o.next_offset, g.n
		FROM (SELECT (SELECT count(*) FROM %[1]s.scd2sink_snapshots WHERE consumer_group = $1 AND done_at IS NOT NULL)
			+ coalesce((SELECT n FROM %[1]s.scd2sink_outside_writes WHERE consumer_group = $1), 0) AS n) g
		LEFT JOIN (SELECT x.t AS topic, x.p AS partition, x.n AS next_offset FROM (SELECT x.t, x.p, (SELECT o.next_offset FROM %[1]s.scd2sink_offsets o
					WHERE o.consumer_group = $1 AND o.topic = x.t AND o.partition = x.p) AS n
				FROM unnest($2::text[], $3::int[]) AS x(t, p) OFFSET 0) x WHERE x.n IS NOT NULL
			UNION ALL
			SELECT o.topic, o.partition, o.next_offset FROM %[1]s.%[2]s r
				JOIN %[1]s.scd2sink_offsets o ON o.consumer_group = r.consumer_group AND o.topic = r.topic
			WHERE r.consumer_group = $1 AND r.resized_at IS NOT NULL AND r.topic = ANY ($2::text[])) o ON true`,
		pgx.Identifier{l.schema}.Sanitize(), catalog.TopicsTable), l.group, topics, nums)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("setting the batch's planner options: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("locking partitions: %w", err)
	}
	var grown, resized string
	var n int64
	if err := br.QueryRow().Scan(&grown, &resized, &n); err != nil {
		return fmt.Errorf("locking resized topics: %w", err)
	}
	if grown != "" {
		return &errTopicGrown{topics: strings.Split(grown, ","), max: tmax, names: tnames}
	}
	if resized != "" {
		l.mem.noteResized(strings.Split(resized, ",")) // not applied in parts any more (parallel.go)
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("reading scd2sink_offsets: %w", err)
	}
	defer rows.Close()
	var reconciled int64
	var recs []recorded
	for rows.Next() {
		var topic *string
		var part *int32
		var off *int64
		if err := rows.Scan(&topic, &part, &off, &reconciled); err != nil {
			return err
		}
		if topic != nil { // else no offsets recorded yet
			recs = append(recs, recorded{part: change.Partition{Topic: *topic, Partition: *part}, offset: *off})
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading scd2sink_offsets: %w", err)
	}
	rows.Close()
	if l.mem.sawFence(reconciled, recs, offsets) {
		l.erasures.Stale() // an erase counts as an outside write
	}
	return br.Close()
}

func (l *Ledger) writeDeadLetters(ctx context.Context, tx pgx.Tx, dead []plan.DeadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	rows := make([][]any, len(dead))
	now := time.Now()
	for i, d := range dead {
		var hdrs []byte
		if len(d.Headers) > 0 {
			hs := make([]plan.Header, len(d.Headers))
			for i, h := range d.Headers {
				// jsonb refuses \u0000: a NUL in a key is written as \0.
				hs[i] = plan.Header{Key: strings.ReplaceAll(h.Key, "\x00", `\0`), Value: h.Value}
			}
			hdrs, _ = json.Marshal(hs) // strings and bytes: cannot fail
		}
		rows[i] = []any{d.Origin.Topic, d.Origin.Partition.Partition, d.Origin.Offset, d.Table, d.Key, d.Value, cleanText(d.Err), now, hdrs, d.Decoded, nullIfEmpty(d.Reason)}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{l.schema, l.deadLetters},
		[]string{"topic", "partition", "offset", "target", "key", "value", "error", "created_at", "headers", "decoded", "reason"}, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("writing %d dead letters: %w", len(dead), err)
	}
	return nil
}

// writeOffsets records the batch's offsets. They never move backwards
// for one topic ID: only a topic re-created under the same name (another
// ID), or a partition rewound on purpose, replaces a higher offset.
func (l *Ledger) writeOffsets(ctx context.Context, tx pgx.Tx, positions map[change.Partition]Position) error {
	if len(positions) == 0 {
		return nil
	}
	var topics, tids, targets []string
	var parts []int32
	var offs []int64
	var anch [][]byte
	var back []bool
	var valid []*time.Time
	for p, pos := range positions {
		topics, parts, offs = append(topics, p.Topic), append(parts, p.Partition), append(offs, pos.Offset)
		anch, tids, back = append(anch, []byte(pos.Anchor)), append(tids, pos.TopicID), append(back, pos.Rewound)
		targets = append(targets, pos.Target)
		if !pos.LastValid.IsZero() {
			valid = append(valid, &pos.LastValid)
		} else {
			valid = append(valid, nil)
		}
	}
	q := fmt.Sprintf(`INSERT INTO %[1]s.scd2sink_offsets AS o (consumer_group, topic, partition, next_offset, anchor_seq, topic_id, target, last_valid_from, updated_at)
		SELECT $1, t, p, n, a, nullif(i, ''), nullif(g, ''), CASE WHEN v IS NOT NULL THEN least(v, now()) END, now()
		FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bytea[], $6::text[], $7::text[], $8::timestamptz[]) AS x(t, p, n, a, i, g, v)
		ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET
			target = coalesce(excluded.target, o.target),
			last_valid_from = CASE WHEN excluded.topic_id IS DISTINCT FROM o.topic_id AND excluded.topic_id IS NOT NULL AND o.topic_id IS NOT NULL
				THEN excluded.last_valid_from
				WHEN o.last_valid_from IS NULL OR excluded.last_valid_from > o.last_valid_from
				THEN coalesce(excluded.last_valid_from, o.last_valid_from) ELSE o.last_valid_from END,
			next_offset = CASE WHEN excluded.topic_id IS DISTINCT FROM o.topic_id AND excluded.topic_id IS NOT NULL AND o.topic_id IS NOT NULL
				THEN excluded.next_offset ELSE greatest(o.next_offset, excluded.next_offset) END,
			anchor_seq = CASE WHEN excluded.topic_id IS DISTINCT FROM o.topic_id AND excluded.topic_id IS NOT NULL AND o.topic_id IS NOT NULL
				THEN excluded.anchor_seq ELSE coalesce(excluded.anchor_seq, o.anchor_seq) END,
			topic_id = coalesce(excluded.topic_id, o.topic_id), updated_at = now()`,
		pgx.Identifier{l.schema}.Sanitize())
	if _, err := tx.Exec(ctx, q, l.group, topics, parts, offs, anch, tids, targets, valid); err != nil {
		return fmt.Errorf("recording offsets: %w", err)
	}
	if !slices.Contains(back, true) {
		return nil
	}
	// Partitions rewound on purpose: the new offset replaces the old.
	q = fmt.Sprintf(`UPDATE %[1]s.scd2sink_offsets AS o SET next_offset = x.n, anchor_seq = coalesce(x.a, o.anchor_seq), updated_at = now()
		FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bytea[], $6::bool[]) AS x(t, p, n, a, r)
		WHERE x.r AND o.consumer_group = $1 AND o.topic = x.t AND o.partition = x.p`, pgx.Identifier{l.schema}.Sanitize())
	if _, err := tx.Exec(ctx, q, l.group, topics, parts, offs, anch, back); err != nil {
		return fmt.Errorf("recording rewound offsets: %w", err)
	}
	return nil
}

// Rewind lowers the offsets recorded for the configured consumer group to
// the given ones, where they are higher: partitions placed back on purpose
// because the log they were read from was truncated. Anchors are kept (the
// highest sequence below the old offset bounds the one below the new).
func (l *Ledger) Rewind(ctx context.Context, to map[change.Partition]int64) error {
	var topics []string
	var parts []int32
	var offs []int64
	for p, o := range to {
		topics, parts, offs = append(topics, p.Topic), append(parts, p.Partition), append(offs, o)
	}
	_, err := l.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.scd2sink_offsets AS o SET next_offset = x.n, updated_at = now()
		FROM unnest($2::text[], $3::int[], $4::bigint[]) AS x(t, p, n)
		WHERE o.consumer_group = $1 AND o.topic = x.t AND o.partition = x.p AND o.next_offset > x.n`,
		pgx.Identifier{l.schema}.Sanitize()), l.group, topics, parts, offs)
	if err != nil {
		return fmt.Errorf("rewinding offsets: %w", err)
	}
	return nil
}

// TopicIDs returns the Kafka topic ID recorded with each partition's
// offsets for the configured consumer group (partitions recorded without
// one are missing).
func (l *Ledger) TopicIDs(ctx context.Context) (map[change.Partition]string, error) {
	rows, err := l.pool.Query(ctx, fmt.Sprintf(`SELECT topic, partition, topic_id FROM %s.scd2sink_offsets
		WHERE consumer_group = $1 AND topic_id IS NOT NULL`,
		pgx.Identifier{l.schema}.Sanitize()), l.group)
	if err != nil {
		return nil, fmt.Errorf("reading scd2sink_offsets: %w", err)
	}
	defer rows.Close()
	out := map[change.Partition]string{}
	for rows.Next() {
		var p change.Partition
		var id string
		if err := rows.Scan(&p.Topic, &p.Partition, &id); err != nil {
			return nil, err
		}
		out[p] = id
	}
	return out, rows.Err()
}

// Anchors returns, per partition of the configured consumer group, the
// highest sequence of the records below its recorded offset: what a
// consumer resuming there anchors a snapshot read without a sequence to.
func (l *Ledger) Anchors(ctx context.Context) (map[change.Partition]change.Seq, error) {
	rows, err := l.pool.Query(ctx, fmt.Sprintf(`SELECT topic, partition, anchor_seq FROM %s.scd2sink_offsets WHERE consumer_group = $1 AND anchor_seq IS NOT NULL`,
		pgx.Identifier{l.schema}.Sanitize()), l.group)
	if err != nil {
		return nil, fmt.Errorf("reading scd2sink_offsets: %w", err)
	}
	defer rows.Close()
	out := map[change.Partition]change.Seq{}
	for rows.Next() {
		var p change.Partition
		var a []byte
		if err := rows.Scan(&p.Topic, &p.Partition, &a); err != nil {
			return nil, err
		}
		out[p] = a
	}
	return out, rows.Err()
}

// Offsets returns the offsets recorded in scd2sink_offsets for the
// configured consumer group: the next offset to consume per partition.
func (l *Ledger) Offsets(ctx context.Context) (map[change.Partition]int64, error) {
	rows, err := l.pool.Query(ctx, fmt.Sprintf(`SELECT topic, partition, next_offset FROM %s.scd2sink_offsets WHERE consumer_group = $1`,
		pgx.Identifier{l.schema}.Sanitize()), l.group)
	if err != nil {
		return nil, fmt.Errorf("reading scd2sink_offsets: %w", err)
	}
	defer rows.Close()
	out := map[change.Partition]int64{}
	for rows.Next() {
		var p change.Partition
		var o int64
		if err := rows.Scan(&p.Topic, &p.Partition, &o); err != nil {
			return nil, err
		}
		out[p] = o
	}
	return out, rows.Err()
}

// HistoryTables reports which of the given targets' history tables exist
// (a target the Sink has no spec for counts as absent).
func (l *Ledger) HistoryTables(ctx context.Context, targets []string) (map[string]bool, error) {
	out := make(map[string]bool, len(targets))
	for _, target := range targets {
		spec, ok := l.spec(target)
		if !ok {
			continue
		}
		var exists bool
		if err := l.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
			pgx.Identifier{spec.Schema, spec.Target}.Sanitize()).Scan(&exists); err != nil {
			return nil, fmt.Errorf("looking for history table %s: %w", target, err)
		}
		out[target] = exists
	}
	return out, nil
}
