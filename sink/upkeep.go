package sink

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/catalog"
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

func (v upkeepView) Spec(target string) (catalog.TableSpec, bool) { return v.s.spec(target) }

func (v upkeepView) Specs() []catalog.TableSpec {
	v.s.specMu.Lock()
	defer v.s.specMu.Unlock()
	out := make([]catalog.TableSpec, 0, len(v.s.specs))
	for _, spec := range v.s.specs {
		out = append(out, spec)
	}
	return out
}

func (v upkeepView) Table(target string) *catalog.Table {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if t := v.s.tables[target]; t != nil {
		return t.Table
	}
	return nil
}

func (v upkeepView) Partitioned() []*catalog.Partitions {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	var out []*catalog.Partitions
	for _, t := range v.s.tables {
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
	return v.s.erasedViolations(ctx, spec, hist)
}
