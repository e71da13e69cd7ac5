package sink

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/pgcodec"
	"github.com/scd2sink/scd2sink/sink/plan"
	"github.com/scd2sink/scd2sink/sink/statecache"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"go.uber.org/zap"
)

// Apply folds a batch into the history tables, writes its dead letters and
// records its offsets, in one transaction, or in one per part when it is
// applied in parts (parallel.go), retried on transient errors. A returned
// error means nothing of the batch was applied, or, applied in parts,
// that some parts committed (their offsets recorded with them) and the
// others did not; ApplyPrepared again with the same Prepared applies the
// rest. It is Prepare followed by ApplyPrepared.
func (s *Sink) Apply(ctx context.Context, b Batch) (Result, error) {
	p, err := s.Prepare(ctx, b)
	if err != nil {
		return Result{}, err
	}
	return s.ApplyPrepared(ctx, p)
}

// Prepared is a batch ready for ApplyPrepared.
type Prepared struct {
	positions map[change.Partition]Position // Batch.Positions
	// topicTargets names the target of each topic of positions.
	topicTargets map[string]string
	confirm      func(context.Context) error
	plans        map[string]*plan.TablePlan
	targets      []string
	dead         []plan.DeadLetter
	early        []plan.EarlyTruncate
	// snapshots are recorded with the batch; lock are partitions locked
	// without offsets (Batch.Snapshots, Batch.Lock).
	snapshots []Snapshot
	lock      []change.Partition
	// lockTargets: Batch.LockTargets.
	lockTargets []string
	replay      map[change.Origin][]int64 // Batch.Replay
	outside     bool                      // Batch.Outside
	// mismatches counts the dead letters whose value did not fit its column.
	mismatches int
	// parts are the batch's parts applied side by side (nil: applied
	// whole), cut once (cut); committed marks a part that committed
	// (parallel.go).
	cut       bool
	parts     []*Prepared
	committed bool
}

// Prepare does the CPU-bound half of applying a batch: it creates tables and
// columns met for the first time, converts values to the column types,
// digests and groups the events. A caller may prepare the next batch while
// ApplyPrepared applies the previous one (one goroutine each); prepared
// batches must still be applied in order.
func (s *Sink) Prepare(ctx context.Context, b Batch) (*Prepared, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	afters := make([]map[string]any, len(b.Events))
	var bad []plan.DeadLetter
	for i, ev := range b.Events {
		if ev.CanVisitAfter() && ev.Op.HasAfter() {
			continue // decoded in plan, straight into its row
		}
		a, err := ev.DecodeAfter()
		if err != nil {
			bad = append(bad, plan.EventDeadLetter(ev, plan.ReasonInvalid, err))
		}
		afters[i] = a
	}
	if err := s.prepare(ctx, b.Events, afters); err != nil {
		return nil, err
	}
	plans, dead, early, mismatches := s.planner.Plan(b.Events, afters, s.tables, s.spec)
	dead = append(bad, dead...)
	topics := map[string]string{}
	for part, pos := range b.Positions {
		if pos.Target != "" {
			topics[part.Topic] = pos.Target
		}
	}
	p := &Prepared{positions: b.Positions, topicTargets: topics, confirm: b.Confirm, plans: plans, early: early, mismatches: mismatches,
		snapshots: b.Snapshots, lock: b.Lock, lockTargets: b.LockTargets, replay: b.Replay, outside: b.Outside,
		dead: append(append([]plan.DeadLetter(nil), b.DeadLetters...), dead...)}
	s.noteLetterKeys(ctx, p.dead)
	for name := range plans {
		p.targets = append(p.targets, name)
	}
	sort.Strings(p.targets) // a fixed lock order across instances
	return p, nil
}

// ApplyPrepared applies a prepared batch; see Apply. Then it reconciles
// completed snapshots whose topics have been applied past them; a failure
// there is logged and tried again after the next batch.
func (s *Sink) ApplyPrepared(ctx context.Context, p *Prepared) (Result, error) {
	res, err := s.applyPrepared(ctx, p)
	if err == nil {
		s.recon.afterBatch(ctx)
	}
	return res, err
}

// Reconcile decides every recorded snapshot whose topic has been applied
// past it (reconciled, or held by the guard), whoever recorded it: the
// consumer calls it about once a second while it has nothing to apply, so
// that a snapshot recorded by another member, or whose topic's partitions
// all went quiet, is not left waiting for a batch that never comes
// (DESIGN.md section 5). Called from the goroutine that applies batches;
// without a table that closes what snapshots did not read it does nothing.
func (s *Sink) Reconcile(ctx context.Context) error {
	return s.recon.idle(ctx)
}

// SkipReconcile makes reconciliation leave the snapshots of the targets
// skip names waiting (the consumer's parked targets). Call it before the
// first batch.
func (s *Sink) SkipReconcile(skip func(target string) bool) { s.recon.skip = skip }

// anySnapshotDeletes reports whether a known target closes what a full
// snapshot did not read.
func (s *Sink) anySnapshotDeletes() bool {
	s.specMu.Lock()
	defer s.specMu.Unlock()
	for _, on := range s.snapDeletes {
		if on {
			return true
		}
	}
	return false
}

// applyOne applies a prepared batch, or one part of it (parallel.go), in
// one transaction.
func (s *Sink) applyOne(ctx context.Context, p *Prepared) (Result, error) {
	plans, dead, targets, positions := p.plans, p.dead, p.targets, p.positions
	var gen uint64
	var seen int64
	var res Result
	var ops *cacheOps
	// A value PostgreSQL rejects fails the whole batch; the batch is then
	// applied again isolating the events that carry such values.
	isolate := false
	attempt := func(ctx context.Context) error {
		res, ops = Result{}, &cacheOps{Ops: statecache.Ops{Off: isolate || s.mem.cache.Limit() <= 0}}
		gen = s.mem.forgetNow() // a Forget during the retries counts too
		return pgx.BeginTxFunc(ctx, s.pool, applyTx, func(tx pgx.Tx) error {
			pgcodec.Register(tx.Conn().TypeMap())
			if err := s.fence(ctx, tx, positions, p.lock); err != nil {
				return err
			}
			for _, name := range p.lockTargets {
				spec, ok := s.spec(name)
				if !ok {
					return fmt.Errorf("locking the writers of %s: no such table is configured", name)
				}
				if err := s.lockTargetWriters(ctx, tx, spec, []string{name}); err != nil {
					return &TargetError{Target: name, Err: err}
				}
			}
			seen = s.mem.lastReconciled() // what this transaction's fence saw
			for _, e := range p.early {
				if _, err := recordTruncate(ctx, tx, s.cfg.Schema, e.Target, e.Seq, e.At); err != nil {
					return err
				}
			}
			if err := s.markReplayed(ctx, tx, p.replay); err != nil {
				return err
			}
			if len(positions) == 0 && len(p.lock) == 0 {
				s.erasures.stale.Store(true) // no fence read the outside-writes count
			}
			erased, dead, err := s.erasures.drop(ctx, tx, p, dead)
			if err != nil {
				return err
			}
			res.Erased = erased
			if p.outside {
				if err := s.countOutsideWrite(ctx, tx); err != nil {
					return err
				}
			}
			if !isolate {
				if ops.pre, err = prefetch(ctx, tx, s.cfg.Schema, s.mem.holds, plans, targets); err != nil {
					return err
				}
			}
			allDead := dead
			for _, name := range targets {
				apply := s.applyTable
				if isolate {
					apply = s.applyIsolating
				}
				r, d, err := s.applyKeyChanges(ctx, tx, plans[name], ops, apply)
				if err == nil && r.VersionsOpened > 0 && s.snapshotDeletes(name) {
					err = s.recon.noteLate(ctx, tx, plans[name])
				}
				if err != nil {
					return &TargetError{Target: name, Err: fmt.Errorf("applying batch to %s: %w", name, err)}
				}
				res.add(r)
				allDead = append(allDead, d...)
			}
			newDead, err := s.failedAgain(ctx, tx, p.replay, allDead)
			if err != nil {
				return err
			}
			if err := s.writeDeadLetters(ctx, tx, newDead); err != nil {
				return err
			}
			if err := s.recon.recordSnapshots(ctx, tx, p.snapshots); err != nil {
				return err
			}
			res.DeadLetters = len(allDead)
			res.Dead = make([]DeadNote, len(allDead))
			for i, d := range allDead {
				reason := d.Reason
				if reason == "" {
					reason = plan.ReasonDecode
				}
				res.Dead[i] = DeadNote{Origin: d.Origin, Table: d.Table, Reason: reason, Err: d.Err}
			}
			if err := s.writeOffsets(ctx, tx, positions); err != nil {
				return err
			}
			if p.confirm != nil {
				return p.confirm(ctx)
			}
			return nil
		})
	}
	err := s.once(ctx, attempt)
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
		err = s.once(ctx, attempt)
	}
	if err != nil && isDataError(err) {
		s.log.Warn("a value was rejected by PostgreSQL; applying the batch again without it", zap.Error(err))
		isolate = true
		err = s.once(ctx, attempt)
	}
	res.TypeMismatches = p.mismatches
	if err != nil {
		s.mem.failed()
		return Result{}, err // nothing of it committed
	}
	if len(p.snapshots) > 0 {
		// Committed: a reconciliation that starts from here sees them
		// (recordSnapshots bumped the count too, before the commit).
		s.recon.noteRecorded()
	}
	// Savepoints roll back what ops recorded; another part's fence may
	// have seen a reconciliation that committed after this one's; a
	// Forget meanwhile keeps nothing of it.
	s.mem.committed(gen, &ops.Ops, isolate, seen, positions)
	return res, nil
}

// keyedPlans makes the batch transaction's statements probe the history
// tables' key indexes. They join a batch's keys (unnest of arrays, which
// the planner guesses at 10 rows) with a history table; with stale
// statistics the planner otherwise hash-joins them with a sequential scan
// of the whole table, once per statement and batch (seen in
// BenchmarkPipeline: the Type 1 update of older versions, matched on the
// key alone). Scoped to the transaction.
const keyedPlans = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
	set_config('enable_mergejoin', 'off', true)`

// applyTx is a batch's transaction: READ COMMITTED whatever the server's
// default, so that each statement sees what committed before it and took
// its locks (the column types read after a table's lock, prefetch.go; the
// offsets read after the partitions' advisory locks, fence).
var applyTx = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// cacheOps is what one transaction carries besides its statements: the
// changes it makes to the state cache once it commits, the slabs the
// states it unpacks take their values from, and what it read ahead. It
// belongs to the transaction's goroutine.
type cacheOps struct {
	statecache.Ops
	// mem holds the values and structs of the states unpacked for the
	// transaction.
	mem fold.Mem
	// pre is what the transaction read ahead for its tables (prefetch.go).
	pre *prefetched
}
