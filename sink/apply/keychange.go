package apply

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/history"
	"github.com/scd2sink/scd2sink/sink/plan"
	"go.uber.org/zap"
)

// applyFunc applies one table's plan in a transaction.
type applyFunc func(ctx context.Context, tx pgx.Tx, p *plan.TablePlan, ops *Ops) (Result, []plan.DeadLetter, error)

// WithKeyChanges applies a table's plan in two steps when it holds
// creates of primary-key changes with placeholders (DESIGN.md section 5:
// "previous" is the old key's version live just before the create): first
// every other key, the old keys among them, then, with the placeholders
// resolved from the table, the keys those creates open. Applying a batch
// in parts within one transaction gives the same history as the whole.
func (a *Applier) WithKeyChanges(ctx context.Context, tx pgx.Tx, p *plan.TablePlan, ops *Ops, apply applyFunc) (Result, []plan.DeadLetter, error) {
	var first, second []*plan.KeyPlan
	for _, kp := range p.Order {
		if kp.NeedsOldKey() {
			second = append(second, kp)
		} else {
			first = append(first, kp)
		}
	}
	if len(second) == 0 {
		return apply(ctx, tx, p, ops)
	}
	res, dead, err := apply(ctx, tx, p.SubPlan(first, true), ops)
	if err != nil {
		return res, nil, err
	}
	// The old keys are read from the table: what the first step queued
	// goes first.
	if err := ops.Later.Run(ctx, tx); err != nil {
		return res, nil, err // another table's, maybe (a *plan.TargetError)
	}
	resolved := make([]*plan.KeyPlan, len(second))
	for i, kp := range second {
		if resolved[i], err = a.resolveOldKeys(ctx, tx, p.Table, kp); err != nil {
			return res, nil, err
		}
	}
	r, d, err := apply(ctx, tx, p.SubPlan(resolved, false), ops)
	if err != nil {
		return res, nil, err
	}
	res.Add(r)
	return res, append(dead, d...), nil
}

// resolveOldKeys returns a copy of kp whose primary-key-change creates take
// their placeholder columns from the old key's latest version before the
// create. An old key the table does not hold (yet: it may live in another
// partition that is behind) leaves those columns NULL, with a warning.
func (a *Applier) resolveOldKeys(ctx context.Context, tx pgx.Tx, t *plan.Table, kp *plan.KeyPlan) (*plan.KeyPlan, error) {
	out := &plan.KeyPlan{ID: kp.ID, Key: kp.Key, Events: slices.Clone(kp.Events)}
	for j, e := range out.Events {
		if e.OldKey == nil {
			continue
		}
		old, err := history.RowBefore(ctx, tx, t, e.OldKey, e.Seq)
		if err != nil {
			return nil, fmt.Errorf("reading the old key of a primary-key change in %s: %w", t.Hist.Sanitize(), err)
		}
		if old == nil {
			a.log.Warn("primary-key change: the old key's version is not in the history table; unavailable columns of the new key are NULL",
				zap.String("table", t.Spec.Target), zap.String("seq", e.Seq.String()), zap.Strings("columns", e.Unavail))
		}
		row := slices.Clone(e.Row)
		for i, v := range row {
			if _, ok := v.(plan.Unavailable); ok {
				row[i] = nil
				if old != nil {
					row[i] = old[i]
				}
			}
		}
		e.Row, e.Unavail, e.OldKey = row, nil, nil
		out.Events[j] = e
	}
	return out, nil
}
