package sink

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"go.uber.org/zap"
)

// ensureServiceTables creates what is missing of the offsets, truncates,
// snapshots and dead-letter tables.
func ensureServiceTables(ctx context.Context, pool *pgxpool.Pool, cfg *Config) error {
	s := pgx.Identifier{cfg.Schema}.Sanitize()
	cat, err := catalog.ReadCatalog(ctx, pool, cfg.Schema,
		[]string{"scd2sink_offsets", "scd2sink_truncates", "scd2sink_snapshots", cfg.DeadLetterTable, watermarkView, progressTable, claimsTable, outsideWritesTable, topicsTable, lateTable, erasuresTable}, "", "")
	if err != nil {
		return err
	}
	var stmts []string
	if !cat.Schema {
		stmts = append(stmts, catalog.CreateSchema(cfg.Schema))
	}
	if !cat.Has(topicsTable) {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (consumer_group text NOT NULL, topic text NOT NULL,
			partitions integer NOT NULL, resized_at timestamptz, PRIMARY KEY (consumer_group, topic))`, s, topicsTable))
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
	if !cat.Has(lateTable) {
		// Reconciled snapshots that late events reached (reconcile.go):
		// appended to, never updated, so a batch never waits on a
		// reconciliation's rows.
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (
			consumer_group text NOT NULL, target text NOT NULL, scd_seq bytea NOT NULL,
			noted_at timestamptz NOT NULL DEFAULT now())`, s, lateTable),
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s.%s (consumer_group, target, scd_seq)`, lateTable+"_idx", s, lateTable))
	}
	if !cat.Has(cfg.DeadLetterTable) {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.%s (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text, partition integer,
			"offset" bigint, target text, key bytea, value bytea, error text NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now(), headers jsonb, replayed_at timestamptz, decoded boolean)`, s, pgx.Identifier{cfg.DeadLetterTable}.Sanitize()))
	} else if !cat.HasCol(cfg.DeadLetterTable, "headers") {
		// The record's headers: without Apicurio's schema id header a
		// dead letter's bare Avro could never be decoded again.
		stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s.%s ADD COLUMN IF NOT EXISTS headers jsonb`, s, pgx.Identifier{cfg.DeadLetterTable}.Sanitize()))
	}
	stmts = append(stmts, watermarkDDL(cat, cfg)...)
	stmts = append(stmts, claimsDDL(cat, cfg)...)
	stmts = append(stmts, replayDDL(cat, cfg)...)
	stmts = append(stmts, erasureDDL(cat, cfg)...)
	if len(stmts) == 0 {
		return nil
	}
	cfg.Logger.Info("creating the service's tables", zap.String("schema", cfg.Schema), zap.Int("statements", len(stmts)))
	return catalog.InDDLTx(ctx, pool, "scd2sink service tables", stmts)
}
