package maint

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/catalog"
)

// Claims make the members of a group agree on which topic writes a target
// that topic_pattern entries give to more than one topic: each member
// resolves topics as its own metadata shows them, in its own order, so
// "the first topic keeps the target" must be decided in one place.
// scd2sink_targets holds, per consumer group, a target's topic; the first
// claim stays (until its row is deleted by hand, to hand the target over).

// Claim records topic as the writer of target unless another topic holds
// it, and returns the topic that holds it.
func (m *Maint) Claim(ctx context.Context, target, topic string) (string, error) {
	q := fmt.Sprintf(`WITH ins AS (
			INSERT INTO %[1]s.%[2]s (consumer_group, target, topic) VALUES ($1, $2, $3)
			ON CONFLICT (consumer_group, target) DO NOTHING RETURNING topic)
		SELECT topic FROM ins UNION ALL
		SELECT topic FROM %[1]s.%[2]s WHERE consumer_group = $1 AND target = $2
		LIMIT 1`, pgx.Identifier{m.cfg.Schema}.Sanitize(), catalog.ClaimsTable)
	// A claim committed by another member after this statement's snapshot
	// was taken conflicts with the insert yet is not seen by the select:
	// the next try sees it.
	for try := 0; try < 3; try++ {
		var owner string
		err := m.pool.QueryRow(ctx, q, m.cfg.ConsumerGroup, target, topic).Scan(&owner)
		if err == nil {
			return owner, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return "", fmt.Errorf("claiming target %s for topic %s: %w", target, topic, err)
		}
	}
	return "", fmt.Errorf("claiming target %s for topic %s: no answer after 3 tries", target, topic)
}
