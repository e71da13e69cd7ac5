package apply

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/history"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// IsDataError reports whether PostgreSQL rejected a value: SQLSTATE class
// 22 (data exception) or 23 (integrity constraint violation).
func IsDataError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 && !history.StaleStatement(err) && !catalog.NoPartition(err) && !catalog.OverlapRefused(err) {
		return pgErr.Code[:2] == "22" || pgErr.Code[:2] == "23"
	}
	return false
}

// Isolating applies a table's plan when the batch as a whole hit a
// value PostgreSQL rejects: it finds the events carrying such values by
// bisecting the plan's keys under savepoints, dead-letters them with the
// database's message, and applies everything else. Splitting a batch by
// keys is safe: keys do not interact, and a batch applied in parts within
// one transaction gives the history of the same events arriving in
// several batches, which the fold makes identical.
func (a *Applier) Isolating(ctx context.Context, tx pgx.Tx, p *plan.TablePlan, ops *Ops) (Result, []plan.DeadLetter, error) {
	res, dead, err := a.trySavepoint(ctx, tx, p, ops)
	if err == nil || !IsDataError(err) {
		return res, dead, err
	}
	if len(p.Order) > 1 {
		half := len(p.Order) / 2
		var total Result
		var allDead []plan.DeadLetter
		for i, part := range []*plan.TablePlan{p.SubPlan(p.Order[:half], true), p.SubPlan(p.Order[half:], false)} {
			r, d, err := a.Isolating(ctx, tx, part, ops)
			if err != nil {
				return total, nil, fmt.Errorf("part %d of %s: %w", i+1, p.Table.Spec.Target, err)
			}
			total.Add(r)
			allDead = append(allDead, d...)
		}
		return total, allDead, nil
	}
	if len(p.Order) == 0 {
		return res, nil, err // a truncate alone cannot carry a bad value
	}
	return a.isolateKey(ctx, tx, p, p.Order[0], ops, err)
}

// isolateKey finds the events of one key that PostgreSQL rejects. The
// key's events (in sequence order) are taken in turn: the shortest prefix
// of those not yet judged that fails, after the ones kept, ends in a
// rejected event (found by bisection under savepoints that are always
// rolled back); it becomes a dead letter and the search goes on after it.
// Every rejected event is found, however many there are, with a few
// probes each, and every other event is applied. A key may arrive with no
// events of its own (a truncate's re-fold): then only the truncates apply.
func (a *Applier) isolateKey(ctx context.Context, tx pgx.Tx, p *plan.TablePlan, kp *plan.KeyPlan, ops *Ops, cause error) (Result, []plan.DeadLetter, error) {
	planOf := func(evs []fold.Event) *plan.TablePlan {
		return p.SubPlan([]*plan.KeyPlan{{ID: kp.ID, Key: kp.Key, Events: evs}}, true)
	}
	with := func(kept, more []fold.Event) []fold.Event {
		return append(append(make([]fold.Event, 0, len(kept)+len(more)), kept...), more...)
	}
	var kept []fold.Event
	var dead []plan.DeadLetter
	rest := kp.Events
	lastErr := cause
	for len(rest) > 0 {
		// kept+rest is known to fail (at the start: the caller's failure).
		lo, hi := 0, len(rest)-1
		for lo < hi {
			mid := (lo + hi) / 2
			err := a.probe(ctx, tx, planOf(with(kept, rest[:mid+1])), ops)
			switch {
			case err == nil:
				lo = mid + 1
			case IsDataError(err):
				hi, lastErr = mid, err
			default:
				return Result{}, nil, err
			}
		}
		dead = append(dead, plan.EventDeadLetter(rest[lo].Src, plan.ReasonRejected, fmt.Errorf("rejected by PostgreSQL: %w", lastErr)))
		kept, rest = with(kept, rest[:lo]), rest[lo+1:]
		if len(rest) == 0 {
			break
		}
		err := a.probe(ctx, tx, planOf(with(kept, rest)), ops)
		if err == nil {
			kept, rest = with(kept, rest), nil
			break
		}
		if !IsDataError(err) {
			return Result{}, nil, err
		}
		lastErr = err
	}
	res, d, err := a.trySavepoint(ctx, tx, planOf(kept), ops)
	if err == nil {
		res.Rejected += len(dead)
		return res, append(dead, d...), nil
	}
	if !IsDataError(err) {
		return res, nil, err
	}
	// What was kept fails on its own after all (a rejection that depends
	// on more than one event): every event of the key in this batch goes
	// to the dead-letter table, with the truncates applied alone.
	dead = dead[:0]
	for _, e := range kp.Events {
		dead = append(dead, plan.EventDeadLetter(e.Src, plan.ReasonRejected, fmt.Errorf("rejected by PostgreSQL with the key's other events of the batch: %w", err)))
	}
	r, d, err2 := a.trySavepoint(ctx, tx, planOf(nil), ops)
	if err2 != nil {
		return r, nil, err2
	}
	r.Rejected += len(kp.Events)
	return r, append(dead, d...), nil
}

// probe applies p inside a savepoint and always rolls it back: it only
// asks whether PostgreSQL accepts p.
func (a *Applier) probe(ctx context.Context, tx pgx.Tx, p *plan.TablePlan, ops *Ops) error {
	if _, err := tx.Exec(ctx, "SAVEPOINT scd2sink_probe"); err != nil {
		return err
	}
	_, _, err := a.Table(ctx, tx, p, ops)
	if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT scd2sink_probe; RELEASE SAVEPOINT scd2sink_probe"); rerr != nil {
		return rerr
	}
	return err
}

// trySavepoint applies p inside a savepoint, rolling back to it on error.
func (a *Applier) trySavepoint(ctx context.Context, tx pgx.Tx, p *plan.TablePlan, ops *Ops) (Result, []plan.DeadLetter, error) {
	if _, err := tx.Exec(ctx, "SAVEPOINT scd2sink_isolate"); err != nil {
		return Result{}, nil, err
	}
	res, dead, err := a.Table(ctx, tx, p, ops)
	if err != nil {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT scd2sink_isolate; RELEASE SAVEPOINT scd2sink_isolate"); rerr != nil {
			return res, nil, rerr
		}
		return res, nil, err
	}
	_, err = tx.Exec(ctx, "RELEASE SAVEPOINT scd2sink_isolate")
	return res, dead, err
}
