package apply

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/history"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// refoldTruncated folds again every key of p's table that has a version
// live at one of the new truncates fresh (a version opened at the
// truncate's own sequence counts: at equal sequences a key's event comes
// before a truncate, as in sortEvents's stable order). The keys are read in key order,
// tuning.TruncateChunk at a time, each chunk after the last key of the one
// before: keys of the batch are only noted in forced (the batch folds
// them with its events); the others are read, folded and written chunk by
// chunk. A chunk's writes touch only its own keys, so the next chunk's
// query is not disturbed by them.
func (a *Applier) refoldTruncated(ctx context.Context, tx pgx.Tx, p *plan.TablePlan, fresh []change.Seq, truncs []fold.Event,
	forced map[string]*plan.KeyPlan, ops *Ops, res *Result) error {
	t := p.Table
	seqs := make([][]byte, len(fresh))
	for i, sq := range fresh {
		seqs[i] = sq
	}
	keys := catalog.QuoteIdents(t.KeyNames())
	var after []string
	for i, kt := range t.KeyTypes() {
		after = append(after, fmt.Sprintf("$%d::%s", i+2, kt))
	}
	// Keys with a NULL (only in a table adopted with such rows; the sink
	// never writes one) are left alone: ROW comparison with a NULL is
	// NULL, which would end the pagination early.
	var notNull []string
	for _, k := range t.KeyNames() {
		notNull = append(notNull, pgx.Identifier{k}.Sanitize()+" IS NOT NULL")
	}
	live := `EXISTS (SELECT 1 FROM unnest($1::bytea[]) s(seq) WHERE h.scd_seq <= s.seq AND (h.scd_close_seq IS NULL OR h.scd_close_seq > s.seq))
		AND ` + strings.Join(notNull, " AND ")
	first := fmt.Sprintf(`SELECT DISTINCT %[1]s FROM %[2]s h WHERE %[3]s ORDER BY %[1]s LIMIT %[4]d`, keys, t.Hist.Sanitize(), live, a.tune.TruncateChunk)
	next := fmt.Sprintf(`SELECT DISTINCT %[1]s FROM %[2]s h WHERE %[3]s AND ROW(%[1]s) > ROW(%[5]s) ORDER BY %[1]s LIMIT %[4]d`,
		keys, t.Hist.Sanitize(), live, a.tune.TruncateChunk, strings.Join(after, ", "))
	ops.ResetAll = true // far too many keys to drop one by one
	var last []any
	for {
		q, args := first, []any{seqs}
		if last != nil {
			q, args = next, append(args, last...)
		}
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("finding versions a truncate closes in %s: %w", t.Hist.Sanitize(), err)
		}
		var chunk []*plan.KeyPlan
		n := 0
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				rows.Close()
				return err
			}
			n++
			last = vals
			id := plan.KeyID(vals)
			if kp := p.Keys[id]; kp != nil {
				forced[id] = kp
			} else {
				chunk = append(chunk, &plan.KeyPlan{ID: id, Key: vals})
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("finding versions a truncate closes in %s: %w", t.Hist.Sanitize(), err)
		}
		if len(chunk) > 0 {
			hists, err := history.Load(ctx, tx, t, chunk)
			if err != nil {
				return err
			}
			w := &history.Writes{}
			for i, kp := range chunk {
				a.repairKey(t, kp, nil, hists[i], truncs, true, w, res)
			}
			if err := w.Exec(ctx, tx, t); err != nil {
				return err
			}
		}
		if n < a.tune.TruncateChunk {
			return nil
		}
	}
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
