package sink

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/catalog"
)

// lockTargetWriters takes the advisory locks of every partition of the
// topics that write the targets (spec's exact topic, the topics claimed
// for them, those whose recorded offsets name them), for every consumer
// group that records progress on those topics (a rebuild's group too),
// in the fences' order: those writers wait. The partitions are those
// with a recorded offset and those a recorded partition count names (a
// partition not applied yet has no offset; a partition added later than
// the count is recorded before its first batch applies, errTopicGrown).
func (l *Ledger) lockTargetWriters(ctx context.Context, tx pgx.Tx, spec TableSpec, targets []string) error {
	target := spec.Target
	var exact []string
	if spec.Topic != "" {
		exact = append(exact, spec.Topic)
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(`WITH t AS (
			SELECT unnest($2::text[]) AS topic
			UNION SELECT topic FROM %[1]s.%[2]s WHERE target = ANY($1)
			UNION SELECT topic FROM %[1]s.scd2sink_offsets WHERE target = ANY($1))
		SELECT consumer_group, topic, partition FROM (SELECT DISTINCT consumer_group, topic, partition FROM (
			SELECT o.consumer_group, o.topic, o.partition FROM %[1]s.scd2sink_offsets o WHERE o.topic IN (SELECT topic FROM t)
			UNION ALL
			SELECT r.consumer_group, r.topic, p.n FROM %[1]s.%[3]s r, generate_series(0, r.partitions - 1) AS p(n)
			WHERE r.topic IN (SELECT topic FROM t)) x) d ORDER BY consumer_group COLLATE "C", topic COLLATE "C", partition`,
		pgx.Identifier{l.schema}.Sanitize(), catalog.ClaimsTable, catalog.TopicsTable), targets, exact)
	if err != nil {
		return fmt.Errorf("reading the partitions of %s: %w", target, err)
	}
	var locks []int64
	for rows.Next() {
		var group, topic string
		var part int32
		if err := rows.Scan(&group, &topic, &part); err != nil {
			return err
		}
		locks = append(locks, partitionLockOf(group, topic, part))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading the partitions of %s: %w", target, err)
	}
	if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT k FROM unnest($1::bigint[]) WITH ORDINALITY AS x(k, o) ORDER BY o) l`, locks); err != nil {
		return fmt.Errorf("waiting for the writers of %s: %w", target, err)
	}
	return nil
}
