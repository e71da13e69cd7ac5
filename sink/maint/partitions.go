package maint

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"go.uber.org/zap"
)

// partitionsAhead creates, in a transaction of its own, p's partitions of
// the current interval at now and of the Ahead intervals after it.
func (m *Maint) partitionsAhead(ctx context.Context, p *catalog.Partitions, now time.Time) error {
	need := p.Ahead(now)
	_, err := m.cfg.Retry(ctx, "partitions", "creating partitions of "+p.Old().Sanitize(), func(ctx context.Context) error {
		return p.EnsureOwn(ctx, m.pool, need)
	})
	return err
}

// PartitionsAhead creates the partitions Ahead intervals after now's for
// every partitioned table the writers have loaded (run calls it hourly).
func (m *Maint) PartitionsAhead(ctx context.Context, now time.Time) error {
	var errs []error
	for _, p := range m.w.Partitioned() {
		if err := m.partitionsAhead(ctx, p, now); err != nil {
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
func (m *Maint) dropEmptyBefore(ctx context.Context, spec catalog.TableSpec, p *catalog.Partitions, horizon time.Time) (dropped, waiting int, err error) {
	rs, err := catalog.ReadPartitions(ctx, m.pool, p.Old())
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
			return pgx.BeginFunc(ctx, m.pool, func(tx pgx.Tx) error {
				if err := m.w.LockWriters(ctx, tx, spec, []string{spec.Target}); err != nil {
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
				return m.w.NoteOutsideWrite(ctx, tx)
			})
		}()
		if sqlState(err) == "55P03" {
			waiting++
			m.cfg.Logger.Warn("retention: an emptied partition waits for the next pass: its lock is held (a long query on it or on the closed versions)",
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
		if err := p.Reload(ctx, m.pool); err != nil {
			return dropped, waiting, err
		}
	}
	return dropped, waiting, nil
}
