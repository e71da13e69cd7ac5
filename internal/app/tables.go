package app

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
)

// resolvedTables is every table the configuration writes: the exact
// entries, and what the topic_pattern entries resolve the topics to that
// the group has applied (those in scd2sink_offsets), in target order.
func resolvedTables(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, router *config.Router) ([]config.Table, error) {
	var out []config.Table
	for _, t := range cfg.Tables {
		if t.TopicPattern == "" {
			out = append(out, t)
		}
	}
	if !router.HasPatterns() {
		return out, nil
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT DISTINCT topic FROM %s.scd2sink_offsets WHERE consumer_group = $1 ORDER BY topic`,
		pgx.Identifier{cfg.Postgres.Schema}.Sanitize()), cfg.Kafka.GroupID)
	if err != nil {
		return nil, fmt.Errorf("reading the topics applied from scd2sink_offsets: %w", err)
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading the topics applied from scd2sink_offsets: %w", err)
	}
	for _, topic := range topics {
		if t, err := router.Resolve(topic); err == nil && t.TopicPattern != "" {
			out = append(out, t)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	return out, nil
}
