package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/erasure"
	"github.com/scd2sink/scd2sink/sink/maint"
)

// The history's upkeep lives in package maint; the Sink is its Writer
// (upkeepView) and keeps the commands' entry points.

// Violation is one broken history invariant (maint.Violation).
type Violation = maint.Violation

// MaxViolationsListed is how many violations of one check Verify lists
// (maint.MaxViolationsListed).
const MaxViolationsListed = maint.MaxViolationsListed

// RetainResult is what one retention pass over a table removed
// (maint.RetainResult).
type RetainResult = maint.RetainResult

// Verify checks the invariants of DESIGN.md section 5 on the history
// table of target (maint.Maint.Verify).
func (s *Sink) Verify(ctx context.Context, target string) ([]Violation, error) {
	return s.maint.Verify(ctx, target)
}

// Retain runs one retention pass over target's history table
// (maint.Maint.Retain).
func (s *Sink) Retain(ctx context.Context, target string, now time.Time, progress func(RetainResult)) (RetainResult, error) {
	return s.maint.Retain(ctx, target, now, progress)
}

// RetainedTargets lists the targets with a retention
// (maint.Maint.RetainedTargets).
func (s *Sink) RetainedTargets(ctx context.Context) ([]string, error) {
	return s.maint.RetainedTargets(ctx)
}

// PartitionsAhead creates the partitions Ahead intervals after now's for
// every partitioned table the Sink has loaded (maint.Maint.PartitionsAhead).
func (s *Sink) PartitionsAhead(ctx context.Context, now time.Time) error {
	return s.maint.PartitionsAhead(ctx, now)
}

// Claim records topic as the writer of target unless another topic holds
// it, and returns the topic that holds it (maint.Maint.Claim).
func (s *Sink) Claim(ctx context.Context, target, topic string) (string, error) {
	return s.maint.Claim(ctx, target, topic)
}

// upkeepView is the Sink as maintenance sees it (maint.Writer).
type upkeepView struct{ s *Sink }

func (v upkeepView) Spec(target string) (catalog.TableSpec, bool) { return v.s.reg.spec(target) }

func (v upkeepView) Specs() []catalog.TableSpec {
	v.s.reg.specMu.Lock()
	defer v.s.reg.specMu.Unlock()
	out := make([]catalog.TableSpec, 0, len(v.s.reg.specs))
	for _, spec := range v.s.reg.specs {
		out = append(out, spec)
	}
	return out
}

func (v upkeepView) Table(target string) *catalog.Table {
	v.s.reg.mu.Lock()
	defer v.s.reg.mu.Unlock()
	if t := v.s.reg.tables[target]; t != nil {
		return t.Table
	}
	return nil
}

func (v upkeepView) Partitioned() []*catalog.Partitions {
	v.s.reg.mu.Lock()
	defer v.s.reg.mu.Unlock()
	var out []*catalog.Partitions
	for _, t := range v.s.reg.tables {
		if t.Parts != nil {
			out = append(out, t.Parts)
		}
	}
	return out
}

func (v upkeepView) LockWriters(ctx context.Context, tx pgx.Tx, spec catalog.TableSpec, targets []string) error {
	return v.s.lockTargetWriters(ctx, tx, spec, targets)
}

func (v upkeepView) NoteOutsideWrite(ctx context.Context, tx pgx.Tx) error {
	return v.s.countOutsideWrite(ctx, tx)
}

func (v upkeepView) Watermarks(ctx context.Context) (map[string]time.Time, error) {
	return v.s.Watermarks(ctx)
}

func (v upkeepView) ErasedViolations(ctx context.Context, spec catalog.TableSpec, hist string) ([]Violation, error) {
	return v.s.erasures.Violations(ctx, v.s.pool, spec, hist)
}

// Erase erases (or lifts the erasure of) keys of one target in one
// transaction that waits for the target's writers (erasure.Set.Erase).
func (s *Sink) Erase(ctx context.Context, req erasure.EraseRequest) (erasure.EraseResult, error) {
	return s.erasures.Erase(ctx, upkeepView{s}, req)
}

// KeySpec returns target's spec with its key columns, read from its
// history table when the config names none (erasure.Writers).
func (v upkeepView) KeySpec(ctx context.Context, target string) (catalog.TableSpec, error) {
	spec, ok := v.s.reg.spec(target)
	if !ok {
		return spec, fmt.Errorf("erasing from %s: no such table is configured", target)
	}
	if len(spec.Keys) == 0 {
		keys, err := v.s.reg.existingKeys(ctx, spec)
		if err != nil {
			return spec, err
		}
		spec.Keys = keys
	}
	if len(spec.Keys) == 0 {
		return spec, fmt.Errorf("erasing from %s: the table does not exist yet (its key columns are unknown)", target)
	}
	return spec, nil
}

// KeyColumns returns spec's key columns as its history table has them,
// creating the table when it does not exist yet (erasure.Writers).
func (v upkeepView) KeyColumns(ctx context.Context, spec catalog.TableSpec) ([]catalog.ColumnInfo, error) {
	s := v.s
	// The key columns' types, for reading the keys' forms back: the
	// table as it exists.
	s.reg.mu.Lock()
	t := s.reg.tables[spec.Target]
	s.reg.mu.Unlock()
	if t == nil {
		var err error
		if t, err = ensureTable(ctx, s.pool, spec, nil); err != nil {
			return nil, err
		}
	}
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	return t.KeyColumns(), nil
}

// Pool is where erase's transaction runs (erasure.Writers).
func (v upkeepView) Pool() *pgxpool.Pool { return v.s.pool }

// EraseRequest asks Erase to erase (or lift the erasure of) keys of one
// target (erasure.EraseRequest).
type EraseRequest = erasure.EraseRequest

// EraseResult is what Erase did (erasure.EraseResult).
type EraseResult = erasure.EraseResult

// Erased is what Erase did for one key (erasure.Erased).
type Erased = erasure.Erased

// ErrErasureKey marks a missing or wrong erasure_key_file
// (erasure.ErrErasureKey).
var ErrErasureKey = erasure.ErrErasureKey
