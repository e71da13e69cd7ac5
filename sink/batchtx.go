package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/apply"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/history"
	"github.com/scd2sink/scd2sink/sink/pgcodec"
	"github.com/scd2sink/scd2sink/sink/plan"
	"github.com/scd2sink/scd2sink/sink/statecache"
	"github.com/scd2sink/scd2sink/sink/txns"
	"go.uber.org/zap"
)

// applyOne applies a prepared batch, or one part of it (parallel.go), in
// one transaction (batchTx). A batch whose topic grew partitions nobody
// recorded records them first and runs again; one a value PostgreSQL
// rejects fails runs again isolating the events that carry such values.
// Only once the transaction commits does the Sink's memory take its
// changes.
func (s *Sink) applyOne(ctx context.Context, p *Prepared) (apply.Result, error) {
	b := &batchTx{s: s, p: p}
	var gen uint64
	attempt := func(ctx context.Context) error {
		b.reset()
		gen = s.mem.forgetNow() // a Forget during the retries counts too
		return pgx.BeginTxFunc(ctx, s.pool, applyTx, func(tx pgx.Tx) error {
			pgcodec.Register(tx.Conn().TypeMap())
			return b.run(ctx, tx)
		})
	}
	err := once(ctx, s.pool, attempt)
	for tries := 0; tries < 3; tries++ {
		var grown *errTopicGrown
		if !errors.As(err, &grown) {
			break
		}
		// Partitions were added and no assignment recorded it: record it
		// (waiting for the writers under the old count), then apply.
		if _, nerr := s.NotePartitions(ctx, grown.counts()); nerr != nil {
			err = fmt.Errorf("%v: %w", grown, nerr)
			break
		}
		err = once(ctx, s.pool, attempt)
	}
	if err != nil && apply.IsDataError(err) {
		s.log.Warn("a value was rejected by PostgreSQL; applying the batch again without it", zap.Error(err))
		b.isolate = true
		err = once(ctx, s.pool, attempt)
	}
	b.res.TypeMismatches = p.mismatches
	if err != nil {
		s.mem.failed()
		return apply.Result{}, err // nothing of it committed
	}
	if len(p.snapshots) > 0 {
		// Committed: a reconciliation that starts from here sees them
		// (recordSnapshots bumped the count too, before the commit).
		s.recon.noteRecorded()
	}
	// Savepoints roll back what ops recorded; another part's fence may
	// have seen a reconciliation that committed after this one's; a
	// Forget meanwhile keeps nothing of it.
	s.mem.committed(gen, &b.ops.Ops, b.isolate, b.seen, p.positions)
	return b.res, nil
}

// batchTx is one attempt at a batch's transaction. It runs in three
// phases, one call per part of the Sink each: before the tables (the
// fence, writers' locks, early truncates, replay marks, the erasure
// filter, the outside-write count, the read-ahead), the tables (each
// target's share folded by the applier), and after them (dead letters,
// snapshots, offsets, the caller's confirmation). It belongs to the
// goroutine applying the batch.
type batchTx struct {
	s *Sink
	p *Prepared
	// isolate applies every table isolating rejected values (a rerun).
	isolate bool
	// res, ops, seen and dead are the attempt's: what it did, the state
	// cache's changes it would make, the reconciliations its fence saw,
	// and the dead letters it writes.
	res  apply.Result
	ops  *apply.Ops
	seen int64
	dead []plan.DeadLetter
}

// reset starts an attempt afresh.
func (b *batchTx) reset() {
	b.res = apply.Result{}
	b.ops = &apply.Ops{Ops: statecache.Ops{Off: b.isolate || b.s.mem.cache.Limit() <= 0}}
	if !b.isolate && !b.s.applier.Tune().Unqueued {
		// Isolating, each table's writes run inside its savepoints.
		b.ops.Later = &history.Later{}
	}
	b.seen, b.dead = 0, b.p.dead
}

// run runs the attempt's phases in tx.
func (b *batchTx) run(ctx context.Context, tx pgx.Tx) error {
	if err := b.before(ctx, tx); err != nil {
		return err
	}
	if err := b.tables(ctx, tx); err != nil {
		return err
	}
	return b.after(ctx, tx)
}

// before serialises the batch with the other writers of its partitions
// and targets, then records what comes before the tables: truncates of
// tables not created yet, dead letters replayed, erased keys dropped,
// an outside write counted, and the read-ahead of every table's state.
func (b *batchTx) before(ctx context.Context, tx pgx.Tx) error {
	s, p := b.s, b.p
	if err := s.fence(ctx, tx, plannerOptions(p.plans), p.positions, p.lock); err != nil {
		return err
	}
	for _, name := range p.lockTargets {
		spec, ok := s.reg.spec(name)
		if !ok {
			return fmt.Errorf("locking the writers of %s: no such table is configured", name)
		}
		if err := s.lockTargetWriters(ctx, tx, spec, []string{name}); err != nil {
			return &TargetError{Target: name, Err: err}
		}
	}
	b.seen = s.mem.lastReconciled() // what this transaction's fence saw
	for _, e := range p.early {
		if _, err := history.RecordTruncate(ctx, tx, s.cfg.Schema, e.Target, e.Seq, e.At); err != nil {
			return err
		}
	}
	if err := s.markReplayed(ctx, tx, p.replay); err != nil {
		return err
	}
	if len(p.positions) == 0 && len(p.lock) == 0 {
		s.erasures.Stale() // no fence read the outside-writes count
	}
	erased, dead, err := s.erasures.Drop(ctx, tx, p.plans, p.targets, b.dead)
	if err != nil {
		return err
	}
	b.res.Erased, b.dead = erased, dead
	if p.outside {
		if err := s.countOutsideWrite(ctx, tx); err != nil {
			return err
		}
	}
	if !b.isolate {
		if b.ops.Pre, err = history.Prefetch(ctx, tx, s.cfg.Schema, s.mem.holds, p.plans, p.targets); err != nil {
			return err
		}
	}
	return nil
}

// tables folds each target's share of the batch, in the targets' fixed
// order; a failure is its target's (TargetError).
func (b *batchTx) tables(ctx context.Context, tx pgx.Tx) error {
	s := b.s
	for _, name := range b.p.targets {
		fold := s.applier.Table
		if b.isolate {
			fold = s.applier.Isolating
		}
		tp := b.p.plans[name]
		r, d, err := s.applier.WithKeyChanges(ctx, tx, tp, b.ops, fold)
		late := err == nil && r.VersionsOpened > 0 && s.reg.snapshotDeletes(name)
		if err == nil && (late || tp.Table.Spec.NoOverlap) {
			// Both read the table: its queued writes go first.
			err = b.ops.Later.Run(ctx, tx)
		}
		if err == nil && late {
			err = s.recon.noteLate(ctx, tx, tp)
		}
		if err == nil && tp.Table.Spec.NoOverlap {
			// The no-overlap constraint is deferred (a repair writes in any
			// order); checked here, a refusal is this target's, which is
			// parked, not the whole batch's at COMMIT.
			err = catalog.CheckNoOverlap(ctx, tx, tp.Table.Table)
		}
		var owned *TargetError
		if errors.As(err, &owned) {
			return err // queued writes of this table or another (history.Later)
		}
		if err != nil {
			return &TargetError{Target: name, Err: fmt.Errorf("applying batch to %s: %w", name, err)}
		}
		b.res.Add(r)
		b.dead = append(b.dead, d...)
	}
	return b.ops.Later.Run(ctx, tx)
}

// after writes what the batch leaves besides the history: its dead
// letters (those replayed that failed again), the snapshots it
// completed, its partitions' positions; then the caller confirms.
func (b *batchTx) after(ctx context.Context, tx pgx.Tx) error {
	s, p := b.s, b.p
	newDead, err := s.failedAgain(ctx, tx, p.replay, b.dead)
	if err != nil {
		return err
	}
	if err := s.writeDeadLetters(ctx, tx, newDead); err != nil {
		return err
	}
	if err := s.recon.recordSnapshots(ctx, tx, p.snapshots); err != nil {
		return err
	}
	b.res.DeadLetters = len(b.dead)
	b.res.Dead = make([]apply.DeadNote, len(b.dead))
	for i, d := range b.dead {
		reason := d.Reason
		if reason == "" {
			reason = plan.ReasonDecode
		}
		b.res.Dead[i] = apply.DeadNote{Origin: d.Origin, Table: d.Table, Reason: reason, Err: d.Err}
	}
	if len(p.marks) > 0 {
		marks := make([]txns.Mark, len(p.marks))
		for i, m := range p.marks {
			marks[i] = m.Mark
		}
		if err := txns.Applied(ctx, tx, s.cfg.Schema, s.cfg.ConsumerGroup, marks); err != nil {
			return err
		}
	}
	if err := s.writeOffsets(ctx, tx, p.positions); err != nil {
		return err
	}
	if p.confirm != nil {
		return p.confirm(ctx)
	}
	return nil
}
