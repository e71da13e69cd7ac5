package catalog

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Exact completeness from Debezium's transaction metadata (DESIGN.md
// section 14). Three tables and a view, in the service's schema:
//
//   - TransactionsTable: each END record read from a transaction topic,
//     one row per data collection it counts (expected events; awaited:
//     the collection is one this configuration applies), until the
//     transaction is complete (or given up) and pruned.
//   - TransactionEventsTable: one row per applied event that carries a
//     transaction block, written in the batch's own transaction (so it
//     is exactly what committed); distinct per total_order, so a
//     redelivered event counts once.
//   - TransactionReadsTable: how far each transaction topic's partition
//     was read (the next offset, written with the ENDs it covers) and the
//     commit time of the last END read from it (NULL before the first:
//     the topic has no horizon while one of its partitions has none);
//     partition -1 says where partitions met for the first time start.
//   - TransactionHorizonView: per group and transaction topic, the
//     instant through which every transaction is complete: the last END
//     read, or just before the earliest transaction still missing events
//     of an awaited collection. Debezium writes the ENDs in commit order,
//     so a transaction whose END is not read yet committed after every
//     one read: nothing unread can lie below the horizon.
//
// The watermark view takes, for a target whose topic names a transaction
// topic (scd2sink_progress.transaction_topic), the lesser of its own value
// and the horizon less the reorder window (commit times are milliseconds,
// and a source's commit times may step back a little against commit
// order), and NULL while there is no horizon.
const (
	TransactionsTable      = "scd2sink_transactions"
	TransactionEventsTable = "scd2sink_transaction_events"
	TransactionReadsTable  = "scd2sink_transaction_reads"
	TransactionHorizonView = "scd2sink_transaction_horizon"
)

// transactionsNote marks the horizon view's definition.
const transactionsNote = "scd2sink transaction horizon v3"

// transactionsDDL creates what is missing of the tables and the view.
func transactionsDDL(cat *Catalog, svc Service) []string {
	s := pgx.Identifier{svc.Schema}.Sanitize()
	var out []string
	if !cat.Has(TransactionsTable) {
		out = append(out, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s.%[2]s (
			consumer_group text NOT NULL, topic text NOT NULL, id text NOT NULL, collection text NOT NULL,
			expected bigint NOT NULL, awaited boolean NOT NULL, commit_at timestamptz NOT NULL,
			"offset" bigint NOT NULL, read_at timestamptz NOT NULL DEFAULT now(), given_up_at timestamptz,
			PRIMARY KEY (consumer_group, topic, id, collection))`, s, TransactionsTable),
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %[2]s_commit ON %[1]s.%[2]s (consumer_group, topic, commit_at)`, s, TransactionsTable))
	}
	if !cat.Has(TransactionEventsTable) {
		out = append(out, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s.%[2]s (
			consumer_group text NOT NULL, topic text NOT NULL, id text NOT NULL, collection text NOT NULL, total_order bigint NOT NULL,
			at timestamptz, noted_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (consumer_group, topic, id, collection, total_order))`, s, TransactionEventsTable),
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %[2]s_noted ON %[1]s.%[2]s (consumer_group, noted_at)`, s, TransactionEventsTable))
	}
	if !cat.Has(TransactionReadsTable) {
		out = append(out, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s.%[2]s (
			consumer_group text NOT NULL, topic text NOT NULL, partition integer NOT NULL,
			next_offset bigint NOT NULL, read_through timestamptz, updated_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (consumer_group, topic, partition))`, s, TransactionReadsTable))
	}
	if cat.Has(TransactionHorizonView) && cat.Notes[TransactionHorizonView] == transactionsNote {
		return out
	}
	// The earliest incomplete transaction first (by commit time, the
	// index's order): pruning leaves few complete ones before it. Its
	// bound is the earlier of its END's time and its first applied
	// event's valid time, less a microsecond. (least ignores NULLs: a
	// topic with a partition not read yet has no horizon at all.)
	return append(out, fmt.Sprintf(`CREATE OR REPLACE VIEW %[1]s.%[2]s AS
		SELECT r.consumer_group, r.topic, CASE WHEN r.through IS NOT NULL THEN least(r.through, (
				SELECT least(t.commit_at, e.first_at) FROM %[1]s.%[3]s t
				CROSS JOIN LATERAL (SELECT count(*) AS n, min(m.at) AS first_at FROM %[1]s.%[4]s m
					WHERE m.consumer_group = t.consumer_group AND m.topic = t.topic AND m.id = t.id AND m.collection = t.collection) e
				WHERE t.consumer_group = r.consumer_group AND t.topic = r.topic AND t.given_up_at IS NULL
					AND (t.awaited OR e.n > 0) AND e.n < t.expected
				ORDER BY t.commit_at LIMIT 1) - interval '1 microsecond') END AS horizon
		FROM (SELECT consumer_group, topic, CASE WHEN bool_or(read_through IS NULL) THEN NULL ELSE min(read_through) END AS through
			FROM %[1]s.%[5]s WHERE partition >= 0 GROUP BY consumer_group, topic) r`,
		s, TransactionHorizonView, TransactionsTable, TransactionEventsTable, TransactionReadsTable),
		fmt.Sprintf(`COMMENT ON VIEW %s.%s IS %s`, s, TransactionHorizonView, QuoteLiteral(transactionsNote)))
}
