package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"go.uber.org/zap"
)

// closedTimes are the valid_to of the versions w writes closed.
func (w *writes) closedTimes() []time.Time {
	var out []time.Time
	for _, vs := range [][]*fold.Version{w.closeOnly, w.full, w.insVersions} {
		for _, v := range vs {
			if v.Closed {
				out = append(out, v.To)
			}
		}
	}
	return out
}

// partitionsAhead creates, in a transaction of its own, p's partitions of
// the current interval at now and of the Ahead intervals after it.
func (s *Sink) partitionsAhead(ctx context.Context, p *catalog.Partitions, now time.Time) error {
	need := p.Ahead(now)
	_, err := s.withRetry(ctx, "partitions", "creating partitions of "+p.Old().Sanitize(), func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return p.Ensure(ctx, tx, need) })
	})
	return err
}

// PartitionsAhead creates the partitions Ahead intervals after now's for
// every partitioned table the sink has prepared (run calls it hourly).
func (s *Sink) PartitionsAhead(ctx context.Context, now time.Time) error {
	s.mu.Lock()
	var ps []*catalog.Partitions
	for _, t := range s.tables {
		if t.Parts != nil {
			ps = append(ps, t.Parts)
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, p := range ps {
		if err := s.partitionsAhead(ctx, p, now); err != nil {
			errs = append(errs, err) // the next table's go on
		}
	}
	return errors.Join(errs...)
}

// dropEmptyBefore drops the partitions of closed versions whose range ends
// at or before horizon and that hold no row any more, each in a fenced
// transaction of its own; it returns how many it dropped. Detaching takes
// ACCESS EXCLUSIVE on _pold for a moment, waited for at most lock_timeout.
//
// A partition whose lock is not to be had within the lock timeout (an
// analyst's long query on _pold or on the partition) is left attached and
// counted in waiting: the next pass tries it again. It fails neither the
// pass nor readiness, since nothing is wrong: the history is the same
// with the empty partition attached.
func (s *Sink) dropEmptyBefore(ctx context.Context, spec TableSpec, p *catalog.Partitions, horizon time.Time) (dropped, waiting int, err error) {
	rs, err := catalog.ReadPartitions(ctx, s.pool, p.Old())
	if err != nil {
		return 0, 0, err
	}
	for _, r := range rs {
		if r.Hi.After(horizon) {
			continue
		}
		name := pgx.Identifier{p.Schema(), r.Name}
		gone := false
		// One try per pass: DETACH waits for every reader of _pold, and
		// readers queue behind it while it waits, so it waits briefly.
		err := func() error {
			return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				if err := s.lockTargetWriters(ctx, tx, spec, []string{spec.Target}); err != nil {
					return err
				}
				var empty bool
				if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT NOT EXISTS (SELECT 1 FROM %s)`, name.Sanitize())).Scan(&empty); err != nil {
					return fmt.Errorf("looking into partition %s: %w", name.Sanitize(), err)
				}
				if !empty {
					return nil
				}
				for _, st := range []string{
					`SET LOCAL lock_timeout = '200ms'`,
					fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, p.Old().Sanitize(), name.Sanitize()),
					fmt.Sprintf(`DROP TABLE %s`, name.Sanitize()),
				} {
					if _, err := tx.Exec(ctx, st); err != nil {
						return fmt.Errorf("dropping partition %s: %w", name.Sanitize(), err)
					}
				}
				gone = true
				// Writers that remember the partition read the catalog
				// again if they meet a row without one (noPartition).
				return s.countOutsideWrite(ctx, tx)
			})
		}()
		if SQLState(err) == "55P03" {
			waiting++
			s.log.Warn("retention: an emptied partition waits for the next pass: its lock is held (a long query on it or on the closed versions)",
				zap.String("target", spec.Target), zap.String("partition", name.Sanitize()), zap.Error(err))
			continue
		}
		if err != nil {
			return dropped, waiting, err
		}
		if gone {
			dropped++
		}
	}
	if dropped > 0 {
		if err := p.Reload(ctx, s.pool); err != nil {
			return dropped, waiting, err
		}
	}
	return dropped, waiting, nil
}

// warnPlain logs, once per table, that a table configured with
// partitioning exists unpartitioned and is left as it is.
func (s *Sink) warnPlain(t *table) {
	if t == nil || !t.PlainButPartitioned {
		return
	}
	if _, done := s.plainWarned.LoadOrStore(t.Spec.Target, true); !done {
		s.log.Warn("the history table exists unpartitioned and is left as it is: partitioning applies to tables the service creates; migrate with scd2sink rebuild (docs/history-tables.md)",
			zap.String("target", t.Spec.Target))
	}
}
