package sink

import (
	"context"
	"sort"

	"github.com/scd2sink/scd2sink/sink/apply"
	"github.com/scd2sink/scd2sink/sink/plan"
	"github.com/scd2sink/scd2sink/sink/txns"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
)

// Apply folds a batch into the history tables, writes its dead letters and
// records its offsets, in one transaction, or in one per part when it is
// applied in parts (parallel.go), retried on transient errors. A returned
// error means nothing of the batch was applied, or, applied in parts,
// that some parts committed (their offsets recorded with them) and the
// others did not; ApplyPrepared again with the same Prepared applies the
// rest. It is Prepare followed by ApplyPrepared.
func (s *Sink) Apply(ctx context.Context, b Batch) (apply.Result, error) {
	p, err := s.Prepare(ctx, b)
	if err != nil {
		return apply.Result{}, err
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
	// marks place the batch's events in their source transactions, by
	// partition (recorded with the offsets; sink/txns).
	marks []partMark
	// parts are the batch's parts applied side by side (nil: applied
	// whole), cut once (cut); committed marks a part that committed
	// (parallel.go).
	cut       bool
	parts     []*Prepared
	committed bool
}

// partMark is an event's transaction mark, the partition it came from and
// the target it writes (a batch is cut by both).
type partMark struct {
	part   change.Partition
	target string
	txns.Mark
}

// Prepare does the CPU-bound half of applying a batch: it creates tables and
// columns met for the first time, converts values to the column types,
// digests and groups the events. A caller may prepare the next batch while
// ApplyPrepared applies the previous one (one goroutine each); prepared
// batches must still be applied in order.
func (s *Sink) Prepare(ctx context.Context, b Batch) (*Prepared, error) {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
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
	if err := s.reg.ensure(ctx, b.Events, afters); err != nil {
		return nil, err
	}
	plans, dead, early, mismatches := s.planner.Plan(b.Events, afters, s.reg.tables, s.reg.spec)
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
	s.reg.noteLetterKeys(ctx, p.dead)
	for _, ev := range b.Events {
		if ev.Txn != nil {
			p.marks = append(p.marks, partMark{part: ev.Origin.Partition, target: ev.Table,
				Mark: txns.Mark{Topic: ev.Txn.Topic, ID: ev.Txn.ID, Collection: ev.Txn.Collection, Order: ev.Txn.Order, At: ev.ValidFrom}})
		}
	}
	for name := range plans {
		p.targets = append(p.targets, name)
	}
	sort.Strings(p.targets) // a fixed lock order across instances
	return p, nil
}

// ApplyPrepared applies a prepared batch; see Apply. Then it reconciles
// completed snapshots whose topics have been applied past them; a failure
// there is logged and tried again after the next batch.
func (s *Sink) ApplyPrepared(ctx context.Context, p *Prepared) (apply.Result, error) {
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

// keyedPlans makes the batch transaction's statements probe the history
// tables' key indexes. They join a batch's keys (unnest of arrays, which
// the planner guesses at 10 rows) with a history table; with stale
// statistics the planner otherwise hash-joins them with a sequential scan
// of the whole table, once per statement and batch (seen in
// BenchmarkPipeline: the Type 1 update of older versions, matched on the
// key alone). Scoped to the transaction.
const keyedPlans = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
	set_config('enable_mergejoin', 'off', true)`

// genericPlans is keyedPlans, and the transaction's prepared statements
// keep the one plan PostgreSQL made for them (plan_cache_mode). Left to
// itself, PostgreSQL plans a statement afresh on each of its first five
// runs on a connection, and after that whenever the kept plan's cost
// passes the average of the fresh ones, which for a statement over unnest
// of arrays it does (the kept one guesses their length, the fresh ones
// count short arrays): a table's read of its keys' latest versions costs
// about half a millisecond to plan, run after run, and at 200 tables of a
// few keys each that was a third of the transaction. With the joins held
// to index probes (keyedPlans) a kept plan has the shape a fresh one
// would have. Not used when a batch writes a partitioned history table
// (then for none of its tables): before a kept plan runs, PostgreSQL
// locks every partition it may touch (years of partitions), where a
// fresh plan locks those it reads.
const genericPlans = keyedPlans + `, set_config('plan_cache_mode', 'force_generic_plan', true)`

// plannerOptions is the statement setting a batch's planner options over
// plans: genericPlans, or keyedPlans when one of them is partitioned.
func plannerOptions(plans map[string]*plan.TablePlan) string {
	for _, tp := range plans {
		if tp != nil && tp.Table != nil && tp.Table.Parts != nil {
			return keyedPlans
		}
	}
	return genericPlans
}

// applyTx is a batch's transaction: READ COMMITTED whatever the server's
// default, so that each statement sees what committed before it and took
// its locks (the column types read after a table's lock, history.Prefetch; the
// offsets read after the partitions' advisory locks, fence).
var applyTx = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
