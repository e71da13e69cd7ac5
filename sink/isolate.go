package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// isDataError reports whether PostgreSQL rejected a value: SQLSTATE class
// 22 (data exception) or 23 (integrity constraint violation).
func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		return pgErr.Code[:2] == "22" || pgErr.Code[:2] == "23"
	}
	return false
}

// applyIsolating applies a table's plan when the batch as a whole hit a
// value PostgreSQL rejects: it finds the events carrying such values by
// bisecting the plan's keys under savepoints, dead-letters them with the
// database's message, and applies everything else. Splitting a batch by
// keys is safe: keys do not interact, and a batch applied in parts within
// one transaction gives the history of the same events arriving in
// several batches, which the fold makes identical.
func (s *Sink) applyIsolating(ctx context.Context, tx pgx.Tx, p *tablePlan, ops *cacheOps) (Result, []DeadLetter, error) {
	res, dead, err := s.trySavepoint(ctx, tx, p, ops)
	if err == nil || !isDataError(err) {
		return res, dead, err
	}
	if len(p.order) > 1 {
		half := len(p.order) / 2
		var total Result
		var allDead []DeadLetter
		for i, part := range []*tablePlan{p.subPlan(p.order[:half], true), p.subPlan(p.order[half:], false)} {
			r, d, err := s.applyIsolating(ctx, tx, part, ops)
			if err != nil {
				return total, nil, fmt.Errorf("part %d of %s: %w", i+1, p.t.spec.Target, err)
			}
			total.add(r)
			allDead = append(allDead, d...)
		}
		return total, allDead, nil
	}
	if len(p.order) == 0 {
		return res, nil, err // a truncate alone cannot carry a bad value
	}
	// One key: leave out its events one at a time, latest first, until
	// the rest applies; the events left out are the dead letters.
	kp := p.order[0]
	evs := kp.events
	for drop := len(evs) - 1; drop >= 0; drop-- {
		keep := append(append([]fevent(nil), evs[:drop]...), evs[drop+1:]...)
		sub := p.subPlan([]*keyPlan{{id: kp.id, key: kp.key, events: keep}}, true)
		r, d, err2 := s.trySavepoint(ctx, tx, sub, ops)
		if err2 == nil {
			r.Rejected++
			return r, append(d, eventDeadLetter(evs[drop].src, fmt.Errorf("rejected by PostgreSQL: %w", err))), nil
		}
		if !isDataError(err2) {
			return r, nil, err2
		}
	}
	// No single event is to blame: every event of the key in this batch
	// goes to the dead-letter table, with the truncates applied alone.
	for _, e := range evs {
		dead = append(dead, eventDeadLetter(e.src, fmt.Errorf("rejected by PostgreSQL with the key's other events of the batch: %w", err)))
	}
	res = Result{Rejected: len(evs)}
	if len(p.truncates) > 0 {
		r, d, err := s.trySavepoint(ctx, tx, p.subPlan(nil, true), ops)
		if err != nil {
			return r, nil, err
		}
		r.Rejected += res.Rejected
		return r, append(dead, d...), nil
	}
	return res, dead, nil
}

// trySavepoint applies p inside a savepoint, rolling back to it on error.
func (s *Sink) trySavepoint(ctx context.Context, tx pgx.Tx, p *tablePlan, ops *cacheOps) (Result, []DeadLetter, error) {
	if _, err := tx.Exec(ctx, "SAVEPOINT scd2sink_isolate"); err != nil {
		return Result{}, nil, err
	}
	res, dead, err := s.applyTable(ctx, tx, p, ops)
	if err != nil {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT scd2sink_isolate; RELEASE SAVEPOINT scd2sink_isolate"); rerr != nil {
			return res, nil, rerr
		}
		return res, nil, err
	}
	_, err = tx.Exec(ctx, "RELEASE SAVEPOINT scd2sink_isolate")
	return res, dead, err
}

// subPlan is a plan of the same table for some of the keys, with the
// plan's truncates when withTruncates.
func (p *tablePlan) subPlan(keys []*keyPlan, withTruncates bool) *tablePlan {
	sub := &tablePlan{t: p.t, keys: map[string]*keyPlan{}}
	for _, kp := range keys {
		sub.keys[kp.id] = kp
		sub.order = append(sub.order, kp)
	}
	if withTruncates {
		sub.truncates = p.truncates
	}
	return sub
}
