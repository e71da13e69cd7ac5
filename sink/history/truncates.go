package history

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// LoadTruncates reads the truncates applied to the table so far.
func LoadTruncates(ctx context.Context, tx pgx.Tx, schema string, t *plan.Table) ([]fold.Event, error) {
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT scd_seq, valid_from FROM %s.scd2sink_truncates WHERE target = $1 ORDER BY scd_seq`,
		pgx.Identifier{schema}.Sanitize()), t.Hist.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("reading truncates of %s: %w", t.Hist.Sanitize(), err)
	}
	defer rows.Close()
	var out []fold.Event
	for rows.Next() {
		var seq []byte
		var at time.Time
		if err := rows.Scan(&seq, &at); err != nil {
			return nil, err
		}
		out = append(out, fold.Event{Seq: seq, Op: change.OpTruncate, T: at})
	}
	return out, rows.Err()
}

// LiveKeys reads, in key order, up to limit keys of t with a version live
// at one of the sequences seqs (those a truncate closes), after the key
// after (nil: from the first). Keys with a NULL (only in a table adopted
// with such rows; the sink never writes one) are left out: ROW
// comparison with a NULL is NULL, which would end the pages early.
func LiveKeys(ctx context.Context, tx pgx.Tx, t *plan.Table, seqs []change.Seq, after []any, limit int) ([][]any, error) {
	raw := make([][]byte, len(seqs))
	for i, sq := range seqs {
		raw[i] = sq
	}
	keys := catalog.QuoteIdents(t.KeyNames())
	var notNull []string
	for _, k := range t.KeyNames() {
		notNull = append(notNull, pgx.Identifier{k}.Sanitize()+" IS NOT NULL")
	}
	where := `EXISTS (SELECT 1 FROM unnest($1::bytea[]) s(seq) WHERE h.scd_seq <= s.seq AND (h.scd_close_seq IS NULL OR h.scd_close_seq > s.seq))
		AND ` + strings.Join(notNull, " AND ")
	args := []any{raw}
	if after != nil {
		var params []string
		for i, kt := range t.KeyTypes() {
			params = append(params, fmt.Sprintf("$%d::%s", i+2, kt))
		}
		where += fmt.Sprintf(" AND ROW(%s) > ROW(%s)", keys, strings.Join(params, ", "))
		args = append(args, after...)
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT DISTINCT %[1]s FROM %[2]s h WHERE %[3]s ORDER BY %[1]s LIMIT %[4]d`, keys, t.Hist.Sanitize(), where, limit), args...)
	if err != nil {
		return nil, fmt.Errorf("finding versions a truncate closes in %s: %w", t.Hist.Sanitize(), err)
	}
	defer rows.Close()
	var out [][]any
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		out = append(out, vals)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("finding versions a truncate closes in %s: %w", t.Hist.Sanitize(), err)
	}
	return out, nil
}

// RecordTruncate records a truncate of the history table hist (its
// qualified, quoted name) in scd2sink_truncates, in the batch's
// transaction, and reports whether it was not recorded before (one
// recorded already is kept). Every writer records truncates here, and
// only here.
func RecordTruncate(ctx context.Context, tx pgx.Tx, schema, hist string, seq change.Seq, at time.Time) (bool, error) {
	tag, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.%s (target, scd_seq, valid_from) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
		pgx.Identifier{schema}.Sanitize(), catalog.TruncatesTable), hist, []byte(seq), at)
	if err != nil {
		return false, fmt.Errorf("recording a truncate of %s: %w", hist, err)
	}
	return tag.RowsAffected() == 1, nil
}
