package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// Dead letters put right (DESIGN.md section 7). A replay applies
// dead-lettered events again through the normal path, as late events: a
// Batch with Replay set, its events' origins those of the dead letters,
// Lock naming their partitions so that the replay and the writers of those
// partitions take turns. In the batch's transaction the dead letters are
// marked replayed_at, only if no replay marked them first (else the batch
// rolls back with ErrReplayedAlready: never applied twice); an event that
// is rejected again stays a dead letter, its row given the new error and
// replayed_at cleared, instead of a new row; and the outside-writes count
// is bumped, so that every running writer forgets what it remembers of
// the keys (the fence).

// ErrReplayedAlready is returned when another replay marked one of the
// batch's dead letters first: nothing of the batch is applied.
var ErrReplayedAlready = errors.New("a dead letter of the batch was replayed meanwhile")

// markReplayed marks the batch's dead letters replayed and bumps the
// outside-writes count, in the batch's transaction.
func (l *Ledger) markReplayed(ctx context.Context, tx pgx.Tx, replay map[change.Origin][]int64) error {
	if len(replay) == 0 {
		return nil
	}
	var ids []int64
	for _, l := range replay {
		ids = append(ids, l...)
	}
	sch := pgx.Identifier{l.schema}.Sanitize()
	tag, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s.%s SET replayed_at = now() WHERE id = ANY($1) AND replayed_at IS NULL`,
		sch, pgx.Identifier{l.deadLetters}.Sanitize()), ids)
	if err != nil {
		return fmt.Errorf("marking dead letters replayed: %w", err)
	}
	if tag.RowsAffected() != int64(len(ids)) {
		return ErrReplayedAlready
	}
	return l.countOutsideWrite(ctx, tx)
}

// countOutsideWrite bumps the outside-writes count in tx: every writer's
// next fence (ledger_offsets.go) sees it and forgets its cached states.
func (l *Ledger) countOutsideWrite(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.%s AS w (consumer_group, n) VALUES ($1, 1)
		ON CONFLICT (consumer_group) DO UPDATE SET n = w.n + 1`, pgx.Identifier{l.schema}.Sanitize(), catalog.OutsideWritesTable), l.group); err != nil {
		return fmt.Errorf("counting an outside write: %w", err)
	}
	return nil
}

// failedAgain takes out of dead the replayed events rejected again and
// records them on their own rows (the new error, replayed_at cleared);
// the rest are new dead letters.
func (l *Ledger) failedAgain(ctx context.Context, tx pgx.Tx, replay map[change.Origin][]int64, dead []plan.DeadLetter) ([]plan.DeadLetter, error) {
	if len(replay) == 0 {
		return dead, nil
	}
	var rest []plan.DeadLetter
	for _, d := range dead {
		ids, ok := replay[d.Origin]
		if !ok {
			rest = append(rest, d)
			continue
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s.%s SET replayed_at = NULL, error = $2, reason = $3 WHERE id = ANY($1)`,
			pgx.Identifier{l.schema}.Sanitize(), pgx.Identifier{l.deadLetters}.Sanitize()), ids, cleanText(d.Err), nullIfEmpty(d.Reason)); err != nil {
			return nil, fmt.Errorf("recording a dead letter rejected again: %w", err)
		}
	}
	return rest, nil
}

// nullIfEmpty is s, or NULL when it is empty.
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// cleanText makes an error text storable: valid UTF-8, without NUL.
func cleanText(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
}
