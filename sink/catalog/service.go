package catalog

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// The service's own tables, in its schema (DESIGN.md section 4): every
// writer's offsets and positions, truncates, completed snapshots and the
// late events that reached them, and what claims, erasures, outside writes,
// resized topics and the completeness watermark need.
const (
	OffsetsTable   = "scd2sink_offsets"
	TruncatesTable = "scd2sink_truncates"
	SnapshotsTable = "scd2sink_snapshots"
	// LateTable notes reconciled snapshots that late events reached.
	LateTable = "scd2sink_snapshots_late"
	// ClaimsTable holds, per consumer group, which topic writes a target
	// that topic patterns give to more than one.
	ClaimsTable = "scd2sink_targets"
	// ErasuresTable records erased keys as keyed hashes, never the keys.
	ErasuresTable = "scd2sink_erasures"
	// OutsideWritesTable counts writes outside the batch path per group:
	// every writer's fence forgets what it remembers when it moves.
	OutsideWritesTable = "scd2sink_outside_writes"
	// TopicsTable records each topic's partition count and whether it grew.
	TopicsTable = "scd2sink_topics"
	// ProgressTable holds each partition's last look that found it fully
	// applied; WatermarkView gives each target's complete_through.
	ProgressTable = "scd2sink_progress"
	WatermarkView = "scd2sink_watermarks"
)

// Service is what the service's tables are made of.
type Service struct {
	Schema          string
	DeadLetterTable string
	// ReorderWindow is subtracted in the watermark view.
	ReorderWindow time.Duration
	Logger        *zap.Logger
}

// EnsureService creates what is missing of the offsets, truncates,
// snapshots and dead-letter tables.
func EnsureService(ctx context.Context, pool *pgxpool.Pool, svc Service) error {
	s := pgx.Identifier{svc.Schema}.Sanitize()
	cat, err := ReadCatalog(ctx, pool, svc.Schema,
		[]string{OffsetsTable, TruncatesTable, SnapshotsTable, svc.DeadLetterTable, WatermarkView, ProgressTable, ClaimsTable, OutsideWritesTable, TopicsTable, LateTable, ErasuresTable,
			TransactionsTable, TransactionEventsTable, TransactionReadsTable, TransactionHorizonView}, "", "")
	if err != nil {
		return err
	}
	var stmts []string
	if !cat.Schema {
		stmts = append(stmts, CreateSchema(svc.Schema))
	}
	if !cat.Has(TopicsTable) {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (consumer_group text NOT NULL, topic text NOT NULL,
			partitions integer NOT NULL, resized_at timestamptz, PRIMARY KEY (consumer_group, topic))`, s, TopicsTable))
	}
	if !cat.Has("scd2sink_offsets") {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.scd2sink_offsets (
			consumer_group text NOT NULL, topic text NOT NULL, partition integer NOT NULL,
			next_offset bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(),
			anchor_seq bytea, topic_id text, target text, last_valid_from timestamptz,
			PRIMARY KEY (consumer_group, topic, partition))`, s))
	} else {
		// What the completeness watermark is built from (watermark.go).
		for _, col := range []string{"target text", "last_valid_from timestamptz"} {
			if name, _, _ := strings.Cut(col, " "); !cat.HasCol("scd2sink_offsets", name) {
				stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.scd2sink_offsets ADD COLUMN IF NOT EXISTS %s`, s, col))
			}
		}
		if !cat.HasCol("scd2sink_offsets", "anchor_seq") {
			// The highest sequence below next_offset: where a snapshot read
			// without a sequence is anchored after a restart.
			stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.scd2sink_offsets ADD COLUMN IF NOT EXISTS anchor_seq bytea`, s))
		}
		if !cat.HasCol("scd2sink_offsets", "topic_id") {
			// The Kafka topic ID the offsets belong to: a topic deleted and
			// re-created under the same name has another.
			stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.scd2sink_offsets ADD COLUMN IF NOT EXISTS topic_id text`, s))
		}
	}
	if !cat.Has("scd2sink_truncates") {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.scd2sink_truncates (
			target text NOT NULL, scd_seq bytea NOT NULL, valid_from timestamptz NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (target, scd_seq))`, s))
	}
	if !cat.Has("scd2sink_snapshots") {
		// Completed full snapshots of tables with snapshot_deletes: close,
		// until their reconciliation is done (reconcile.go).
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.scd2sink_snapshots (
			consumer_group text NOT NULL, target text NOT NULL, scd_seq bytea NOT NULL,
			valid_from timestamptz NOT NULL, topic text NOT NULL, until jsonb NOT NULL,
			recorded_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz,
			held_at timestamptz, held_keys bigint, live_keys bigint, confirmed_at timestamptz,
			PRIMARY KEY (consumer_group, target, scd_seq))`, s))
	} else if !cat.HasCol("scd2sink_snapshots", "confirmed_at") {
		// The reconciliation guard (reconcile.go): a held one, what it
		// would close, and its confirmation.
		stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.scd2sink_snapshots ADD COLUMN IF NOT EXISTS held_at timestamptz,
			ADD COLUMN IF NOT EXISTS held_keys bigint, ADD COLUMN IF NOT EXISTS live_keys bigint,
			ADD COLUMN IF NOT EXISTS confirmed_at timestamptz`, s))
	}
	if !cat.Has(LateTable) {
		// Reconciled snapshots that late events reached (reconcile.go):
		// appended to, never updated, so a batch never waits on a
		// reconciliation's rows.
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (
			consumer_group text NOT NULL, target text NOT NULL, scd_seq bytea NOT NULL,
			noted_at timestamptz NOT NULL DEFAULT now())`, s, LateTable),
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s.%s (consumer_group, target, scd_seq)`, LateTable+"_idx", s, LateTable))
	}
	if !cat.Has(svc.DeadLetterTable) {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text, partition integer,
			"offset" bigint, target text, key bytea, value bytea, error text NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now(), headers jsonb, replayed_at timestamptz, decoded boolean, reason text)`, s, pgx.Identifier{svc.DeadLetterTable}.Sanitize()))
	} else if !cat.HasCol(svc.DeadLetterTable, "headers") {
		// The record's headers: without Apicurio's schema id header a
		// dead letter's bare Avro could never be decoded again.
		stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.%s ADD COLUMN IF NOT EXISTS headers jsonb`, s, pgx.Identifier{svc.DeadLetterTable}.Sanitize()))
	}
	stmts = append(stmts, transactionsDDL(cat, svc)...) // before the watermark view, which reads the horizon
	stmts = append(stmts, watermarkDDL(cat, svc)...)
	if fresh, err := needsConsistentFunction(ctx, pool, svc.Schema); err != nil {
		return err
	} else if fresh {
		stmts = append(stmts, consistentFunction(svc.Schema)) // after the watermark view it reads
	}
	stmts = append(stmts, claimsDDL(cat, svc)...)
	stmts = append(stmts, replayDDL(cat, svc)...)
	stmts = append(stmts, erasureDDL(cat, svc)...)
	if len(stmts) == 0 {
		return nil
	}
	svc.Logger.Info("creating the service's tables", zap.String("schema", svc.Schema), zap.Int("statements", len(stmts)))
	return InDDLTx(ctx, pool, "scd2sink service tables", stmts)
}

func claimsDDL(cat *Catalog, svc Service) []string {
	if cat.Has(ClaimsTable) {
		return nil
	}
	return []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (
		consumer_group text NOT NULL, target text NOT NULL, topic text NOT NULL,
		claimed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer_group, target))`,
		pgx.Identifier{svc.Schema}.Sanitize(), ClaimsTable)}
}

func erasureDDL(cat *Catalog, svc Service) []string {
	if cat.Has(ErasuresTable) {
		return nil
	}
	s := pgx.Identifier{svc.Schema}.Sanitize()
	return []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, target text NOT NULL, key_hash text NOT NULL,
			action text NOT NULL CHECK (action IN ('erase', 'lift')), erased_at timestamptz NOT NULL DEFAULT now(),
			reason text, versions bigint NOT NULL DEFAULT 0, side_rows bigint NOT NULL DEFAULT 0,
			repairs bigint NOT NULL DEFAULT 0, dead_letters bigint NOT NULL DEFAULT 0, key_check text NOT NULL,
			text_hash text)`, s, ErasuresTable),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s.%s (target, key_hash, id)`, ErasuresTable+"_key", s, ErasuresTable)}
}

func replayDDL(cat *Catalog, svc Service) []string {
	s := pgx.Identifier{svc.Schema}.Sanitize()
	var out []string
	if cat.Has(svc.DeadLetterTable) && !cat.HasCol(svc.DeadLetterTable, "decoded") {
		// replayed_at: put right by a replay; decoded: Key and Value are
		// the decoded form (DeadLetter.Decoded).
		out = append(out, fmt.Sprintf(`ALTER TABLE %s.%s ADD COLUMN IF NOT EXISTS replayed_at timestamptz, ADD COLUMN IF NOT EXISTS decoded boolean`,
			s, pgx.Identifier{svc.DeadLetterTable}.Sanitize()))
	}
	if cat.Has(svc.DeadLetterTable) && !cat.HasCol(svc.DeadLetterTable, "reason") {
		// reason: why it is a dead letter (DeadLetter.Reason), counted by
		// the status page; NULL on rows written before it existed.
		out = append(out, fmt.Sprintf(`ALTER TABLE %s.%s ADD COLUMN IF NOT EXISTS reason text`,
			s, pgx.Identifier{svc.DeadLetterTable}.Sanitize()))
	}
	if !cat.Has(OutsideWritesTable) {
		out = append(out, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (consumer_group text PRIMARY KEY, n bigint NOT NULL)`, s, OutsideWritesTable))
	}
	return out
}

// watermarkNote marks the view's definition: it is replaced only when the
// window changes, so that a restart runs no DDL.
func WatermarkNote(window time.Duration) string {
	return fmt.Sprintf("scd2sink watermarks v5: window %s", window)
}

// watermarkDDL creates scd2sink_progress, and creates or replaces the view
// when it is missing or stale. scd2sink_progress has a row for every
// partition of every topic a member reads (all partitions, not only its
// own: one never applied holds its target's watermark at NULL), with the
// target and the last look that found it fully applied; the looks never
// write scd2sink_offsets.
func watermarkDDL(cat *Catalog, svc Service) []string {
	s := pgx.Identifier{svc.Schema}.Sanitize()
	var out []string
	if !cat.Has(ProgressTable) {
		out = append(out, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (
			consumer_group text NOT NULL, topic text NOT NULL, partition integer NOT NULL, target text NOT NULL,
			caught_up_at timestamptz, connector text, transaction_topic text, PRIMARY KEY (consumer_group, topic, partition))`, s, ProgressTable))
	} else {
		for _, col := range []string{"connector", "transaction_topic"} {
			if !cat.HasCol(ProgressTable, col) {
				out = append(out, fmt.Sprintf(`ALTER TABLE %s.%s ADD COLUMN IF NOT EXISTS %s text`, s, ProgressTable, col))
			}
		}
	}
	note := WatermarkNote(svc.ReorderWindow)
	if cat.Has(WatermarkView) && cat.Notes[WatermarkView] == note {
		return out
	}
	lit := func(v string) string { return "'" + strings.ReplaceAll(v, "'", "''") + "'" }
	return append(out,
		// A partition whose topic names a transaction topic is complete no
		// further than its horizon (transactions.go), and not known
		// complete while there is none.
		fmt.Sprintf(`CREATE OR REPLACE VIEW %[1]s.%[2]s AS
			SELECT target, CASE WHEN bool_or(w IS NULL) THEN NULL ELSE min(w) END AS complete_through
			FROM (SELECT p.target, CASE WHEN p.transaction_topic IS NULL THEN q.w WHEN h.horizon IS NULL OR q.w IS NULL THEN NULL
					ELSE least(q.w, h.horizon - interval %[3]s) END AS w
				FROM %[1]s.%[5]s AS p LEFT JOIN %[1]s.scd2sink_offsets AS o
					ON o.consumer_group = p.consumer_group AND o.topic = p.topic AND o.partition = p.partition
				CROSS JOIN LATERAL (SELECT greatest(o.last_valid_from, p.caught_up_at) - interval %[3]s AS w) AS q
				LEFT JOIN %[1]s.%[6]s AS h ON h.consumer_group = p.consumer_group AND h.topic = p.transaction_topic
				WHERE p.consumer_group NOT LIKE %[4]s) AS q
			GROUP BY target`, s, WatermarkView, lit(fmt.Sprintf("%d microseconds", svc.ReorderWindow.Microseconds())), lit(`%\_\_rebuild`), ProgressTable, TransactionHorizonView),
		fmt.Sprintf(`COMMENT ON VIEW %s.%s IS %s`, s, WatermarkView, lit(note)))
}

// needsConsistentFunction reports whether schema lacks the function
// scd2sink_consistent_through as this release defines it (consistent.go).
func needsConsistentFunction(ctx context.Context, pool *pgxpool.Pool, schema string) (bool, error) {
	var has bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = $1 AND p.proname = $2 AND obj_description(p.oid, 'pg_proc') = $3)`, schema, ConsistentFunction, consistentNote).Scan(&has); err != nil {
		return false, fmt.Errorf("reading the functions of schema %s: %w", schema, err)
	}
	return !has, nil
}
