package sink

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/erasure"
	"github.com/scd2sink/scd2sink/sink/plan"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
)

// Making sure a batch's tables exist and carry its columns, before it is
// planned: DDL, widening, the keys of targets met for the first time.

// newColumns collects, per table, the columns events carry that the table
// lacks, in the order they were first met.
type newColumns struct {
	cols    []change.Column
	at      map[string]int
	guessed map[string]bool // typed by inference, not by a schema
}

func (n *newColumns) note(name, typ string, inferred bool) {
	if n.at == nil {
		n.at, n.guessed = map[string]int{}, map[string]bool{}
	}
	// Names that PostgreSQL cuts to the same 63 bytes are one column (the
	// first met); events carrying both are dead-lettered (package plan).
	i, ok := n.at[catalog.Ident(name)]
	if !ok {
		n.at[catalog.Ident(name)] = len(n.cols)
		n.cols = append(n.cols, change.Column{Name: name, PGType: typ})
		n.guessed[name] = inferred
		return
	}
	// A schema's type beats an inferred one; an inferred text gives way
	// to a more specific inference; a schema's wider type (a table
	// created from a batch whose source widened a column) beats a
	// narrower one.
	if (!inferred && n.guessed[name]) || (inferred && n.guessed[name] && n.cols[i].PGType == "text") ||
		(!inferred && !n.guessed[name] && catalog.Widens(catalog.CanonicalType(n.cols[i].PGType), typ)) {
		n.cols[i].PGType = typ
		n.guessed[name] = inferred
	}
}

// ensure creates tables met for the first time and adds columns that
// events carry but their tables lack: typed and in the schema's order when
// the event has a schema, else typed by inference from the values, in name
// order. DDL runs in its own transactions.
func (r *registry) ensure(ctx context.Context, evs []*change.Event, afters []map[string]any) error {
	extra := map[string]*newColumns{}
	widen := map[string]map[string]string{} // table → column → wider type
	failed := map[string]string{}           // table → the change schema_changes: fail stops at
	// Events written with one schema share its RowDecoder: its columns
	// are noted once per table and batch, not once per event.
	type tableSchema struct {
		table string
		row   change.RowDecoder
	}
	noted := map[tableSchema]bool{}
	if err := r.loadExisting(ctx, evs); err != nil {
		return err
	}
	var order []string
	for i, ev := range evs {
		spec, ok := r.spec(ev.Table)
		if !ok {
			continue
		}
		if len(spec.Keys) == 0 && len(ev.KeyNames) > 0 {
			spec.Keys = ev.KeyNames
			r.setSpec(spec)
		}
		if len(spec.Keys) == 0 {
			continue // no key known yet: a truncate, or dead letters to come
		}
		nc := extra[ev.Table]
		if ev.Op == change.OpTruncate && r.tables[ev.Table] == nil && nc == nil {
			// A truncate alone must still reach a table that exists.
			var exists bool
			if err := r.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
				pgx.Identifier{spec.Schema, spec.Target}.Sanitize()).Scan(&exists); err != nil {
				return fmt.Errorf("looking for table %s: %w", spec.Target, err)
			}
			if exists {
				extra[ev.Table] = &newColumns{}
				order = append(order, ev.Table)
			}
			continue
		}
		t := r.tables[ev.Table]
		note := func(name, typ string, inferred bool) {
			if t != nil {
				if i, ok := t.Index[catalog.Ident(name)]; ok {
					if !inferred && spec.FailOnSchemaChange && !catalog.Holds(t.Cols[i].TypeName, typ) && failed[ev.Table] == "" {
						failed[ev.Table] = fmt.Sprintf("the source's column %s is now of type %s, the history table's is %s", name, typ, t.Cols[i].TypeName)
					}
					if !inferred && catalog.Widens(t.Cols[i].TypeName, typ) {
						if widen[ev.Table] == nil {
							widen[ev.Table] = map[string]string{}
						}
						if prev, ok := widen[ev.Table][t.Cols[i].Name]; !ok || catalog.Widens(catalog.CanonicalType(prev), typ) {
							widen[ev.Table][t.Cols[i].Name] = typ
						}
					}
					return
				}
			}
			if contains(spec.IgnoreColumns, name) {
				return
			}
			if extra[ev.Table] == nil {
				extra[ev.Table] = &newColumns{}
				order = append(order, ev.Table)
			}
			extra[ev.Table].note(name, typ, inferred)
		}
		if ev.Row != nil && !noted[tableSchema{ev.Table, ev.Row}] {
			noted[tableSchema{ev.Table, ev.Row}] = true
			for _, c := range ev.Row.Columns() {
				note(c.Name, c.PGType, false)
			}
			// A complete image (a document) lacks the fields it does not
			// have: that is no drop.
			if t != nil && spec.FailOnSchemaChange && failed[ev.Table] == "" && !ev.Complete {
				if gone := t.Dropped(ev.Row.Columns()); len(gone) > 0 {
					failed[ev.Table] = fmt.Sprintf("the source no longer has column %s (dropped or renamed)", strings.Join(gone, ", "))
				}
			}
		}
		// Without a schema a column is text (DESIGN.md section 4): a value's
		// JSON form does not say whether 1 is an integer column's or a
		// numeric one's.
		if len(ev.Key) == len(spec.Keys) {
			for _, k := range spec.Keys {
				note(k, "text", true)
			}
		}
		if ev.Row == nil && afters[i] == nil && ev.Op.HasAfter() && ev.CanVisitAfter() {
			// An image plan visits without a map: its names alone.
			all := t != nil
			if all {
				ev.VisitAfterNames(func(name string) bool {
					all = t.Has(name, spec.IgnoreColumns)
					return all
				})
			}
			if !all { // most often it has them: noting them would change nothing
				var names []string
				ev.VisitAfterNames(func(name string) bool {
					if !slices.Contains(names, name) {
						names = append(names, name)
					}
					return true
				})
				sort.Strings(names)
				for _, name := range names {
					note(name, "text", true)
				}
			}
		} else if ev.Row == nil && (t == nil || !t.HasAll(afters[i], spec.IgnoreColumns)) { // most often it has them: noting them would change nothing
			names := make([]string, 0, len(afters[i]))
			for name := range afters[i] {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				note(name, "text", true)
			}
		}
	}
	for target, what := range failed {
		return &TargetError{Target: target, Err: &DriftError{Table: r.tables[target].Hist.Sanitize(), What: what +
			"; schema_changes is fail: alter the history table to match, or set schema_changes: evolve"}}
	}
	targets := make([]string, 0, len(widen))
	for target := range widen {
		targets = append(targets, target)
	}
	sort.Strings(targets)
	for _, target := range targets {
		old := r.tables[target]
		var t *plan.Table
		err := once(ctx, r.pool, func(ctx context.Context) (err error) {
			r.unlocked(func() { t, err = widenColumns(ctx, r.pool, r.log, old, widen[target]) })
			return targetErr(target, err)
		})
		if err != nil {
			return targetErr(target, err)
		}
		r.tables[target] = t
	}
	made, err := r.eachTable(ctx, order, func(ctx context.Context, target string) (*plan.Table, error) {
		spec, _ := r.spec(target)
		return ensureTable(ctx, r.pool, spec, extra[target].cols)
	})
	for i, t := range made {
		if t != nil {
			r.warnPlain(t)
			r.tables[order[i]] = t
		}
	}
	return err
}

// ddlWorkers is how many tables' DDL run side by side when a batch meets
// many tables for the first time (eachTable): creating one, or reading
// an existing one's catalog, is a few milliseconds of PostgreSQL's
// catalog work in a dozen round trips, and 200 tables one after the
// other took seconds before their first rows.
const ddlWorkers = 4

// eachTable runs fn for each of targets without r.mu (unlocked), up to
// ddlWorkers at once and never more than the pool's connections, and
// returns their tables in targets' order (nil where fn returned none or
// failed). The first target of each schema runs before the others, alone:
// a schema not created yet is created once (CREATE SCHEMA IF NOT EXISTS
// run side by side collide on the catalog's unique index). After a
// failure no further target starts (each could wait lock_timeout); the
// error is that of the first target, in targets' order, that failed, as
// a TargetError (a panic, recovered and logged, as a plain error, as
// Prepare's own would stop the batch). fn must hold at most one
// connection at a time (catalog.Ensure does): the workers may take every
// connection of the pool. The caller stores the tables, holding r.mu.
func (r *registry) eachTable(ctx context.Context, targets []string, fn func(ctx context.Context, target string) (*plan.Table, error)) ([]*plan.Table, error) {
	if len(targets) == 0 {
		return nil, nil
	}
	out := make([]*plan.Table, len(targets))
	errs := make([]error, len(targets))
	var failed atomic.Bool
	one := func(i int) {
		if failed.Load() {
			return
		}
		defer func() {
			if p := recover(); p != nil { // as Prepare's own goroutine would have: logged with its stack, the batch failed
				r.log.Error("panic making a history table", zap.String("target", targets[i]), zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
				errs[i] = fmt.Errorf("panic making history table %s: %v", targets[i], p)
				failed.Store(true)
			}
		}()
		errs[i] = once(ctx, r.pool, func(ctx context.Context) (err error) {
			out[i], err = fn(ctx, targets[i])
			return targetErr(targets[i], err)
		})
		if errs[i] != nil {
			failed.Store(true)
		}
	}
	workers := ddlWorkers
	if r.pool != nil && len(targets) > 1 {
		workers = min(workers, max(1, int(r.pool.Stat().MaxConns())))
	}
	r.unlocked(func() {
		schemas := map[string]bool{}
		var rest []int
		for i, target := range targets {
			if spec, _ := r.spec(target); !schemas[spec.Schema] {
				schemas[spec.Schema] = true
				one(i)
				continue
			}
			rest = append(rest, i)
		}
		var g errgroup.Group
		g.SetLimit(workers)
		for _, i := range rest {
			g.Go(func() error { one(i); return nil })
		}
		_ = g.Wait()
	})
	for _, err := range errs {
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// targetErr makes err, of one target's DDL, a TargetError (nil stays
// nil), so that a lock or statement timeout is not retried by the loop
// that prepares every table's batches, but parks the target at once
// (ParkTarget).
func targetErr(target string, err error) error {
	var te *TargetError
	if err == nil || errors.As(err, &te) {
		return err
	}
	return &TargetError{Target: target, Err: err}
}

// unlocked runs fn, a statement on a table's DDL, without r.mu, which
// Prepare holds: DDL may wait for its lock up to lock_timeout, and one
// table's wait (a parked table's probe, consumer/park.go) must not stall
// the batches of the others. fn touches no state r.mu guards; its result
// is stored after, under r.mu. Two goroutines preparing one table meanwhile
// run the same idempotent DDL.
func (r *registry) unlocked(fn func()) {
	r.mu.Unlock()
	defer r.mu.Lock()
	fn()
}

// loadExisting loads the tables of evs that exist but were not loaded yet
// (their columns are not declared: they are met first in a batch), so that
// the batch's schemas are compared with their columns: a type the source
// widened while the service was stopped is widened, not dead-lettered.
func (r *registry) loadExisting(ctx context.Context, evs []*change.Event) error {
	seen := map[string]bool{}
	var load []string
	for _, ev := range evs {
		if r.tables[ev.Table] != nil || seen[ev.Table] {
			continue
		}
		seen[ev.Table] = true
		spec, ok := r.spec(ev.Table)
		if ok && len(spec.Keys) == 0 && len(ev.KeyNames) > 0 {
			spec.Keys = ev.KeyNames // keys from the Kafka key, as ensure takes them
			r.setSpec(spec)
		}
		if ok && len(spec.Keys) > 0 {
			load = append(load, ev.Table)
		}
	}
	found, err := r.eachTable(ctx, load, func(ctx context.Context, target string) (*plan.Table, error) {
		spec, _ := r.spec(target)
		var exists bool
		if err := r.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{spec.Schema, spec.Target}.Sanitize()).Scan(&exists); err != nil {
			return nil, fmt.Errorf("looking for table %s: %w", spec.Target, err)
		}
		if !exists {
			return nil, nil
		}
		return ensureTable(ctx, r.pool, spec, nil)
	})
	for i, t := range found {
		if t != nil && r.tables[load[i]] == nil {
			r.tables[load[i]] = t
		}
	}
	return err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// warnPlain logs, once per table, that a table configured with
// partitioning exists unpartitioned and is left as it is.
func (r *registry) warnPlain(t *plan.Table) {
	if t == nil || !t.PlainButPartitioned {
		return
	}
	if _, done := r.plainWarned.LoadOrStore(t.Spec.Target, true); !done {
		r.log.Warn("the history table exists unpartitioned and is left as it is: partitioning applies to tables the service creates; migrate with scd2sink rebuild (docs/history-tables.md)",
			zap.String("target", t.Spec.Target))
	}
}

// ensureTable brings the target's tables to what spec and the extra
// columns need (catalog.Ensure) and describes them.
func ensureTable(ctx context.Context, pool *pgxpool.Pool, spec TableSpec, extra []change.Column) (*plan.Table, error) {
	t, err := catalog.Ensure(ctx, pool, spec, extra)
	if err != nil {
		return nil, err
	}
	return plan.NewTable(t), nil
}

// widenColumns widens t's columns named in to (catalog.Widen) and
// describes the table anew.
func widenColumns(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger, t *plan.Table, to map[string]string) (*plan.Table, error) {
	w, err := catalog.Widen(ctx, pool, log, t.Table, to)
	if err != nil {
		return nil, err
	}
	return plan.NewTable(w), nil
}

// noteLetterKeys gives the dead letters whose key has no identity yet
// their table's key columns, loading a table not loaded yet (a batch of
// dead letters alone after a restart), so that the writers' filter reads
// their keys back (erasures.erasedDeadLetter). Called holding r.mu.
func (r *registry) noteLetterKeys(ctx context.Context, dead []plan.DeadLetter) {
	var load []*change.Event
	seen := map[string]bool{}
	for _, d := range dead {
		if (d.KeyID == "" || erasure.HasKeyHeaders(d.Headers)) && !seen[d.Table] && r.tables[d.Table] == nil {
			seen[d.Table] = true
			load = append(load, &change.Event{Table: d.Table})
		}
	}
	if len(load) > 0 {
		if err := r.loadExisting(ctx, load); err != nil {
			r.log.Warn("loading a dead letter's table to read its key back failed: an erased key's dead letter in another form than its text is not recognised",
				zap.Error(err))
		}
	}
	cols := map[string][]catalog.ColumnInfo{}
	for i := range dead {
		d := &dead[i]
		if d.KeyID != "" && !erasure.HasKeyHeaders(d.Headers) {
			continue
		}
		kc, ok := cols[d.Table]
		if !ok {
			if t := r.tables[d.Table]; t != nil {
				kc = t.KeyColumns()
			}
			cols[d.Table] = kc
		}
		d.KeyCols = kc
	}
}
