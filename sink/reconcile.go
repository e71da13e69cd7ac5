package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/plan"

	"github.com/scd2sink/scd2sink/sink/pgcodec"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/scd2sink/scd2sink/internal/change"
	"go.uber.org/zap"
)

// Snapshot reconciliation (snapshot_deletes: close, DESIGN.md section 5).
//
// A completed full snapshot at sequence S is recorded in scd2sink_snapshots
// in the transaction of the batch that held its last read, with the offsets
// every snapshot record of its topic lies below. Once scd2sink_offsets shows
// every partition of the topic applied that far, the keys the snapshot did
// not read are the keys with a version live at S (opened below S, not
// closed by S) and neither a version nor a side row at S: a read at S leaves
// one or the other. They are found by one streaming query, never held all
// in memory, and get a delete at S with the snapshot's time, applied like
// any batch (late deletes are repaired). Applying them again finds them as
// duplicates, so a crash before the snapshot is marked done only repeats
// work. The deletes take the advisory locks of the topic's partitions, and
// marking the snapshot done tells every instance's fence to forget its
// cache.

// Late events. The deletes are right for the keys the table holds when
// the snapshot is reconciled; an event below S that arrives later (a
// dead letter replayed, a key's changes read out of order, a member's
// backlog) may give a key the snapshot did not read a version live at
// S, which the fold closes at S as well. So a batch that opened versions
// of a table that closes what snapshots did not read, with an event below
// a recorded snapshot's sequence, notes that snapshot in
// scd2sink_snapshots_late, in its transaction; reconciliation then runs
// for it again (without the guard: it was decided), finding just the keys
// that are live at S now. The notes are only ever appended and deleted
// (no key to conflict on): a batch never waits for a reconciliation's
// transaction, which waits for the batches' partition locks. A run
// deletes the notes it sees before it looks for keys; a note committed
// after that runs it again.

// reconciler decides completed full snapshots for the Sink s it belongs
// to: a chunk of a snapshot's deletes is a batch of s, fenced like every
// writer's. pending says scd2sink_snapshots may hold snapshots to decide;
// it is set by any goroutine recording a snapshot (a probe applies beside
// the batches, cut.go), and recorded counts those records, so that a
// reconciliation that began before one does not clear the flag. running
// guards against reconciling from reconciliation's own batches; it,
// notBefore (by target and sequence, when a snapshot is looked at again:
// a re-run for late events, or one another instance holds) and warned
// (when a failed reconciliation was last logged) belong to the goroutine
// that applies batches. skip names targets whose snapshots wait (the
// consumer's parked targets).
type reconciler struct {
	s         *Sink
	pending   atomic.Bool
	recorded  atomic.Int64
	running   bool
	notBefore map[string]time.Time
	skip      func(target string) bool
	warned    time.Time
}

// afterBatch reconciles, after a batch committed, the snapshots that may
// be ready; a failure is logged (at most once a minute) and tried again
// after the next batch.
func (r *reconciler) afterBatch(ctx context.Context) {
	if !r.pending.Load() || r.running {
		return
	}
	r.running = true
	defer func() { r.running = false }()
	if err := r.reconcile(ctx); err != nil && time.Since(r.warned) > time.Minute {
		r.warned = time.Now()
		r.s.log.Warn("snapshot reconciliation failed; trying again after the next batch (logged at most once a minute)", zap.Error(err))
	}
}

// idle reconciles while the consumer has nothing to apply (Sink.Reconcile).
func (r *reconciler) idle(ctx context.Context) error {
	if r.running || !r.s.reg.anySnapshotDeletes() {
		return nil
	}
	r.running = true
	defer func() { r.running = false }()
	return r.reconcile(ctx)
}

// noteRecorded says a snapshot was recorded (or noted late) by a
// transaction that committed.
func (r *reconciler) noteRecorded() {
	r.recorded.Add(1)
	r.pending.Store(true)
}

// noteLate notes, in the batch's transaction, every recorded snapshot of
// p's table above the lowest sequence of the events p applied.
func (r *reconciler) noteLate(ctx context.Context, tx pgx.Tx, p *plan.TablePlan) error {
	var low change.Seq
	for _, kp := range p.Order {
		for _, e := range kp.Events {
			if low == nil || e.Seq.Compare(low) < 0 {
				low = e.Seq
			}
		}
	}
	if low == nil {
		return nil
	}
	sch := pgx.Identifier{r.s.cfg.Schema}.Sanitize()
	tag, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s.%[2]s (consumer_group, target, scd_seq)
		SELECT consumer_group, target, scd_seq FROM %[1]s.scd2sink_snapshots WHERE consumer_group = $1 AND target = $2 AND scd_seq > $3`,
		sch, catalog.LateTable), r.s.cfg.ConsumerGroup, p.Table.Spec.Target, []byte(low))
	if err != nil {
		return fmt.Errorf("noting late events of %s: %w", p.Table.Spec.Target, err)
	}
	if tag.RowsAffected() > 0 {
		// As a recorded snapshot: a reconciliation running meanwhile
		// (listed before this commits) leaves the flag set.
		r.recorded.Add(1)
		r.pending.Store(true)
	}
	return nil
}

// takeLateNotes deletes the late notes of snapshot sn that db sees.
func (r *reconciler) takeLateNotes(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sn Snapshot) error {
	if _, err := db.Exec(ctx, fmt.Sprintf(`DELETE FROM %s.%s WHERE consumer_group = $1 AND target = $2 AND scd_seq = $3`,
		pgx.Identifier{r.s.cfg.Schema}.Sanitize(), catalog.LateTable), r.s.cfg.ConsumerGroup, sn.Target, []byte(sn.Seq)); err != nil {
		return fmt.Errorf("taking the late notes of the snapshot of %s: %w", sn.Target, err)
	}
	return nil
}

// recordSnapshots records completed snapshots in the batch's transaction.
func (r *reconciler) recordSnapshots(ctx context.Context, tx pgx.Tx, snaps []Snapshot) error {
	recorded := false
	for _, sn := range snaps {
		if !r.s.reg.snapshotDeletes(sn.Target) {
			continue
		}
		recorded = true
		until := map[string]int64{}
		for p, o := range sn.Until {
			until[strconv.Itoa(int(p))] = o
		}
		u, _ := json.Marshal(until)
		if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.scd2sink_snapshots (consumer_group, target, scd_seq, valid_from, topic, until)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`, pgx.Identifier{r.s.cfg.Schema}.Sanitize()),
			r.s.cfg.ConsumerGroup, sn.Target, []byte(sn.Seq), sn.At, sn.Topic, u); err != nil {
			return fmt.Errorf("recording the snapshot of %s: %w", sn.Target, err)
		}
	}
	if recorded {
		r.recorded.Add(1)
		r.pending.Store(true)
	}
	return nil
}

// reconcile applies the deletes of every recorded snapshot whose topic has
// been applied past it, and marks it done. Another instance reconciling
// the same snapshot makes this one skip it.
func (r *reconciler) reconcile(ctx context.Context) error {
	recorded := r.recorded.Load()
	schema := pgx.Identifier{r.s.cfg.Schema}.Sanitize()
	// Undecided snapshots, and reconciled ones that late events reached
	// (decided: confirmed counts as true, the guard is not asked again).
	rows, err := r.s.pool.Query(ctx, fmt.Sprintf(`SELECT sn.target, sn.scd_seq, sn.valid_from, sn.topic, sn.until,
		sn.confirmed_at IS NOT NULL OR sn.done_at IS NOT NULL, sn.done_at IS NOT NULL,
		sn.done_at IS NOT NULL OR coalesce(bool_and(coalesce(o.next_offset, 0) >= u.until::bigint), true)
		FROM %[1]s.scd2sink_snapshots sn
		LEFT JOIN LATERAL jsonb_each_text(sn.until) AS u(p, until) ON true
		LEFT JOIN %[1]s.scd2sink_offsets o ON o.consumer_group = sn.consumer_group AND o.topic = sn.topic AND o.partition = u.p::int
		WHERE sn.consumer_group = $1 AND (sn.done_at IS NULL AND (sn.held_at IS NULL OR sn.confirmed_at IS NOT NULL)
			OR sn.done_at IS NOT NULL AND EXISTS (SELECT 1 FROM %[1]s.%[2]s l
				WHERE l.consumer_group = sn.consumer_group AND l.target = sn.target AND l.scd_seq = sn.scd_seq))
		GROUP BY sn.target, sn.scd_seq, sn.valid_from, sn.topic, sn.until, sn.confirmed_at, sn.done_at ORDER BY sn.scd_seq`, schema, catalog.LateTable), r.s.cfg.ConsumerGroup)
	if err != nil {
		return fmt.Errorf("reading scd2sink_snapshots: %w", err)
	}
	type pending struct {
		sn                     Snapshot
		confirmed, done, ready bool
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pending, error) {
		var p pending
		var seq []byte
		var until map[string]int64
		if err := r.Scan(&p.sn.Target, &seq, &p.sn.At, &p.sn.Topic, &until, &p.confirmed, &p.done, &p.ready); err != nil {
			return p, err
		}
		p.sn.Seq, p.sn.Until = seq, map[int32]int64{}
		for k, o := range until {
			n, err := strconv.ParseInt(k, 10, 32)
			if err != nil {
				return p, fmt.Errorf("scd2sink_snapshots.until names partition %q", k)
			}
			p.sn.Until[int32(n)] = o
		}
		return p, nil
	})
	if err != nil {
		return fmt.Errorf("reading scd2sink_snapshots: %w", err)
	}
	waiting := false
	for _, p := range list {
		if !p.ready || (r.skip != nil && r.skip(p.sn.Target)) {
			waiting = true
			continue
		}
		id := p.sn.Target + "\x00" + string(p.sn.Seq)
		if at, ok := r.notBefore[id]; ok {
			if time.Now().Before(at) {
				waiting = true // looked at again later (a re-run's pace, another instance at it)
				continue
			}
			delete(r.notBefore, id)
		}
		if r.notBefore == nil {
			r.notBefore = map[string]time.Time{}
		}
		if p.done {
			// A re-run for late events reads the table's live versions: at
			// most one per tuning.LateRerunEvery, a failed one too.
			r.notBefore[id] = time.Now().Add(r.s.tune.LateRerunEvery)
		}
		skipped, err := r.reconcileOne(ctx, p.sn, p.confirmed)
		if err != nil {
			return err
		}
		if skipped {
			// Another instance is at it: look again, in a second.
			waiting = true
			if !p.done {
				r.notBefore[id] = time.Now().Add(time.Second)
			}
		}
	}
	switch {
	case waiting:
		r.pending.Store(true)
	case r.recorded.Load() == recorded:
		r.pending.Store(false) // else one recorded meanwhile waits
	}
	return nil
}

// reconcileOne reconciles one snapshot under a row lock on its record;
// unless confirmed, the guard may hold it instead. It reports whether the
// record was locked by another instance (it then did nothing).
func (r *reconciler) reconcileOne(ctx context.Context, sn Snapshot, confirmed bool) (skipped bool, err error) {
	r.s.reg.mu.Lock() // Prepare, on another goroutine, adds tables
	t := r.s.reg.tables[sn.Target]
	spec, ok := r.s.reg.spec(sn.Target)
	if ok && spec.SnapshotDeletes && t == nil {
		if len(spec.Keys) == 0 {
			spec.Keys, err = r.s.reg.existingKeys(ctx, spec)
		}
		if err == nil && len(spec.Keys) > 0 {
			if t, err = ensureTable(ctx, r.s.pool, spec, nil); err == nil {
				r.s.reg.tables[sn.Target] = t
			}
		}
	}
	r.s.reg.mu.Unlock()
	if err != nil {
		return false, err
	}
	if t == nil || !ok || !spec.SnapshotDeletes {
		// Not a table of this configuration (any longer): nothing to close,
		// nothing late to look at.
		if err := r.takeLateNotes(ctx, r.s.pool, sn); err != nil {
			return false, err
		}
		return false, r.markDone(ctx, nil, sn)
	}
	parts := make([]change.Partition, 0, len(sn.Until))
	for n := range sn.Until {
		parts = append(parts, change.Partition{Topic: sn.Topic, Partition: n})
	}
	err = pgx.BeginFunc(ctx, r.s.pool, func(tx pgx.Tx) error {
		pgcodec.Register(tx.Conn().TypeMap()) // keys read as package history reads them back
		var done bool
		sch := pgx.Identifier{r.s.cfg.Schema}.Sanitize()
		if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT done_at IS NOT NULL FROM %[1]s.scd2sink_snapshots sn WHERE consumer_group = $1 AND target = $2 AND scd_seq = $3
			AND (done_at IS NULL OR EXISTS (SELECT 1 FROM %[1]s.%[2]s l WHERE l.consumer_group = $1 AND l.target = $2 AND l.scd_seq = $3))
			FOR UPDATE OF sn SKIP LOCKED`, sch, catalog.LateTable),
			r.s.cfg.ConsumerGroup, sn.Target, []byte(sn.Seq)).Scan(&done); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				// Done with nothing late, or another instance is at it:
				// then what it may leave (a late note committed after it
				// took the notes) is looked at again.
				busy := true // unknown counts as busy: looked at again
				_ = tx.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %[1]s.scd2sink_snapshots WHERE consumer_group = $1 AND target = $2
					AND scd_seq = $3 AND done_at IS NULL) OR EXISTS (SELECT 1 FROM %[1]s.%[2]s WHERE consumer_group = $1 AND target = $2 AND scd_seq = $3)`,
					sch, catalog.LateTable), r.s.cfg.ConsumerGroup, sn.Target, []byte(sn.Seq)).Scan(&busy)
				skipped = busy
				return nil
			}
			return fmt.Errorf("locking the snapshot of %s: %w", sn.Target, err)
		}
		confirmed = confirmed || done // decided already: a re-run for late events
		// The late notes seen now are taken care of by this run (its key
		// query starts after this statement); one committed later runs it
		// again.
		if err := r.takeLateNotes(ctx, tx, sn); err != nil {
			return err
		}
		keys := t.KeyNames()
		sel := make([]string, len(keys))
		match := make([]string, len(keys))
		for i, k := range keys {
			id := pgx.Identifier{k}.Sanitize()
			sel[i] = "h." + id // read as the table's type: a key is never round-tripped through text
			match[i] = fmt.Sprintf("x.%s = h.%s", id, id)
		}
		m := strings.Join(match, " AND ")
		// (A version marked deleted, deletes: new_record, is no live row.)
		live := `h.scd_seq < $1 AND (h.scd_close_seq IS NULL OR h.scd_close_seq > $1) AND h.scd_op <> 'd'`
		unread := fmt.Sprintf(`NOT EXISTS (SELECT 1 FROM %s x WHERE %s AND x.scd_seq = $1)
			AND NOT EXISTS (SELECT 1 FROM %s x WHERE %s AND x.scd_seq = $1)`, t.Hist.Sanitize(), m, t.Side.Sanitize(), m)
		if f := spec.MaxCloseFraction; !confirmed && f > 0 && f < 1 {
			// Live at S counts the keys whose snapshot read changed them
			// too (their version before S is closed at S).
			held, err := r.guard(ctx, tx, sn, f, fmt.Sprintf(`SELECT count(*) FILTER (WHERE %s), count(*) FROM %s h
				WHERE h.scd_seq < $1 AND (h.scd_close_seq IS NULL OR h.scd_close_seq >= $1) AND h.scd_op <> 'd'`,
				unread, t.Hist.Sanitize()))
			if err != nil || held {
				return err
			}
		}
		rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT %s FROM %s h WHERE %s AND %s`,
			strings.Join(sel, ", "), t.Hist.Sanitize(), live, unread), []byte(sn.Seq))
		if err != nil {
			return fmt.Errorf("finding the keys the snapshot of %s did not read: %w", sn.Target, err)
		}
		defer rows.Close()
		var chunk []*change.Event
		closed := 0
		flush := func() error {
			if len(chunk) == 0 {
				return nil
			}
			// Each chunk commits on its own and fences like every writer:
			// another instance (or run beside reconcile --confirm) forgets
			// the keys before its next apply, never appending to a key a
			// chunk has just closed from a stale cache.
			if _, err := r.s.withRetry(ctx, "reconcile", "applying the snapshot deletes of "+sn.Target, func(ctx context.Context) error {
				p, err := r.s.Prepare(ctx, Batch{Events: chunk, Lock: parts, Outside: true})
				if err != nil {
					return err
				}
				_, err = r.s.applyPrepared(ctx, p)
				return err
			}); err != nil {
				return fmt.Errorf("applying the snapshot deletes of %s: %w", sn.Target, err)
			}
			closed += len(chunk)
			chunk = chunk[:0]
			if r.s.tune.AfterReconcileChunk != nil {
				r.s.tune.AfterReconcileChunk()
			}
			return nil
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return fmt.Errorf("reading the keys the snapshot of %s did not read: %w", sn.Target, err)
			}
			key := make([]any, len(vals))
			for i, v := range vals {
				key[i] = plan.Stored(v)
			}
			chunk = append(chunk, &change.Event{Table: sn.Target, Key: key, Seq: sn.Seq, Op: change.OpDelete, ValidFrom: sn.At})
			if len(chunk) == r.s.tune.ReconcileChunk {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("finding the keys the snapshot of %s did not read: %w", sn.Target, err)
		}
		if err := flush(); err != nil {
			return err
		}
		r.s.log.Info("snapshot reconciled: keys it did not read closed", zap.String("table", sn.Target),
			zap.Stringer("seq", sn.Seq), zap.Time("at", sn.At), zap.Int("closed", closed))
		return r.markDone(ctx, tx, sn)
	})
	return skipped, err
}

// markDone marks a snapshot reconciled (in tx when given).
func (r *reconciler) markDone(ctx context.Context, tx pgx.Tx, sn Snapshot) error {
	q := fmt.Sprintf(`UPDATE %s.scd2sink_snapshots SET done_at = now() WHERE consumer_group = $1 AND target = $2 AND scd_seq = $3`,
		pgx.Identifier{r.s.cfg.Schema}.Sanitize())
	var err error
	if tx != nil {
		_, err = tx.Exec(ctx, q, r.s.cfg.ConsumerGroup, sn.Target, []byte(sn.Seq))
	} else {
		_, err = r.s.pool.Exec(ctx, q, r.s.cfg.ConsumerGroup, sn.Target, []byte(sn.Seq))
	}
	if err != nil {
		return fmt.Errorf("marking the snapshot of %s reconciled: %w", sn.Target, err)
	}
	return nil
}

// guard counts the keys a snapshot would close and the keys live at it
// (count, one query); more than fraction of them closed holds the
// reconciliation: recorded in scd2sink_snapshots (held_at, held_keys,
// live_keys) and logged, until `scd2sink reconcile --confirm`. A snapshot
// that read nothing or little (an empty table after a failed restore, a
// filtering snapshot.select.statement.overrides) would otherwise close the
// whole dimension in one step.
func (r *reconciler) guard(ctx context.Context, tx pgx.Tx, sn Snapshot, fraction float64, count string) (bool, error) {
	var closing, live int64
	if err := tx.QueryRow(ctx, count, []byte(sn.Seq)).Scan(&closing, &live); err != nil {
		return false, fmt.Errorf("counting the keys the snapshot of %s did not read: %w", sn.Target, err)
	}
	if live == 0 || float64(closing) <= fraction*float64(live) {
		return false, nil
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s.scd2sink_snapshots SET held_at = now(), held_keys = $4, live_keys = $5
		WHERE consumer_group = $1 AND target = $2 AND scd_seq = $3`, pgx.Identifier{r.s.cfg.Schema}.Sanitize()),
		r.s.cfg.ConsumerGroup, sn.Target, []byte(sn.Seq), closing, live); err != nil {
		return false, fmt.Errorf("holding the reconciliation of %s: %w", sn.Target, err)
	}
	r.s.log.Warn("snapshot reconciliation held: it would close more of the table's live keys than snapshot_deletes_max_fraction allows; "+
		"check the snapshot, then run `scd2sink reconcile --table "+sn.Target+" --confirm` to apply it",
		zap.String("table", sn.Target), zap.Time("snapshot_at", sn.At), zap.Int64("would_close", closing),
		zap.Int64("live_keys", live), zap.Float64("max_fraction", fraction))
	return true, nil
}

// Held is a reconciliation the guard holds.
type Held struct {
	Target        string
	At            time.Time // the snapshot's time
	HeldAt        time.Time
	Closing, Live int64
}

// held lists the reconciliations the guard holds (Sink.HeldReconciliations).
func (r *reconciler) held(ctx context.Context, target string) ([]Held, error) {
	rows, err := r.s.pool.Query(ctx, fmt.Sprintf(`SELECT target, valid_from, held_at, held_keys, live_keys FROM %s.scd2sink_snapshots
		WHERE consumer_group = $1 AND ($2 = '' OR target = $2) AND held_at IS NOT NULL AND done_at IS NULL
		ORDER BY target, scd_seq`, pgx.Identifier{r.s.cfg.Schema}.Sanitize()), r.s.cfg.ConsumerGroup, target)
	if err != nil {
		return nil, fmt.Errorf("reading the held reconciliations: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Held, error) {
		var h Held
		err := r.Scan(&h.Target, &h.At, &h.HeldAt, &h.Closing, &h.Live)
		return h, err
	})
}

// confirm releases and applies target's held reconciliations (Sink.Confirm).
func (r *reconciler) confirm(ctx context.Context, target string) ([]Held, error) {
	held, err := r.s.HeldReconciliations(ctx, target)
	if err != nil || len(held) == 0 {
		return nil, err
	}
	// Only rows not confirmed yet: one confirmed is not waited for while
	// a running instance reconciles it under its row lock.
	if _, err := r.s.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.scd2sink_snapshots SET confirmed_at = now()
		WHERE consumer_group = $1 AND target = $2 AND held_at IS NOT NULL AND done_at IS NULL AND confirmed_at IS NULL`,
		pgx.Identifier{r.s.cfg.Schema}.Sanitize()), r.s.cfg.ConsumerGroup, target); err != nil {
		return nil, fmt.Errorf("confirming the held reconciliation of %s: %w", target, err)
	}
	return held, r.reconcile(ctx)
}

// HeldReconciliations lists the reconciliations the guard holds (target
// "" for all), those confirmed but not applied yet too (a confirmation
// cut short: confirm again).
func (s *Sink) HeldReconciliations(ctx context.Context, target string) ([]Held, error) {
	return s.recon.held(ctx, target)
}

// Confirm releases the reconciliations the guard holds for target and
// applies them (with every other one that is ready), returning those it
// released. It is for a Sink of its own (the reconcile command), not one
// applying batches; an instance running meanwhile takes the deletes as
// late events (they take the topic's partition locks, as batches do).
func (s *Sink) Confirm(ctx context.Context, target string) ([]Held, error) {
	return s.recon.confirm(ctx, target)
}
