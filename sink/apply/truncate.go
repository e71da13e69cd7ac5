package apply

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
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
	ops.ResetAll = true // far too many keys to drop one by one
	var last []any
	for {
		page, err := history.LiveKeys(ctx, tx, t, fresh, last, a.tune.TruncateChunk)
		if err != nil {
			return err
		}
		var chunk []*plan.KeyPlan
		for _, vals := range page {
			last = vals
			id := plan.KeyID(vals)
			if kp := p.Keys[id]; kp != nil {
				forced[id] = kp
			} else {
				chunk = append(chunk, &plan.KeyPlan{ID: id, Key: vals})
			}
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
			if err := w.Exec(ctx, tx, t, nil); err != nil {
				return err
			}
		}
		if len(page) < a.tune.TruncateChunk {
			return nil
		}
	}
}
