package sink

import (
	"context"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/apply"
	"go.uber.org/zap"
)

// Applying a batch in parts.
//
// A key's events all come from one partition (Kafka partitions by key),
// offsets are recorded per partition, and the fold of one key never reads
// another's rows. So a batch whose partitions fall into disjoint sets, no
// key spanning two, may be applied as one transaction per set, side by
// side on their own connections: each writes its keys' history, its dead
// letters and its partitions' offsets. Each part is exact on its own, and
// a part that commits while another fails leaves the table and
// scd2sink_offsets agreeing: the failed part's events are applied again
// later, and those of the committed part, delivered again with them, are
// duplicates that change nothing.
//
// What reads or writes across keys stays in one transaction: truncates
// (they re-fold every key live at them), creates of primary-key changes
// that read the old key's version, snapshots' records, replays, partitions
// locked without offsets and truncates of tables not created yet. A batch
// holding any of these, or too small to be worth a second connection, is
// applied whole.

// applyPrepared applies a prepared batch: in parts side by side where it
// may be (see above), else in one transaction.
//
// The parts are cut once per Prepared, and a part that committed is not
// applied again when the caller retries the batch after another part
// failed: its dead letters are not written twice, its keys not read again.
func (s *Sink) applyPrepared(ctx context.Context, p *Prepared) (apply.Result, error) {
	if !p.cut {
		p.cut = true
		p.parts = s.split(p, s.parts)
		if p.parts != nil {
			s.stats.splitBatches.Add(1)
		}
	}
	if p.parts == nil {
		return s.applyOne(ctx, p)
	}
	results := make([]apply.Result, len(p.parts))
	errs := make([]error, len(p.parts))
	var wg sync.WaitGroup
	for i, part := range p.parts {
		if part.committed {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if r := recover(); r != nil {
					s.log.Error("panic applying part of a batch", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
					errs[i] = fmt.Errorf("panic applying part %d of %d of a batch: %v", i+1, len(p.parts), r)
				}
			}()
			results[i], errs[i] = s.applyOne(ctx, part)
			part.committed = errs[i] == nil
		}()
	}
	wg.Wait()
	var res apply.Result
	var worst error
	for i, r := range results {
		res.Add(r) // a failed part's result is empty: only what committed counts
		if errs[i] != nil && (worst == nil || severity(errs[i]) > severity(worst)) {
			worst = errs[i]
		}
	}
	return res, worst
}

// severity ranks a part's error: the batch reports its worst part's, so
// that a fatal error (a panic) is not retried as the transient one of
// another part.
func severity(err error) int {
	switch Classify(err) {
	case Transient:
		return 0
	case Blocked:
		return 1
	case Data:
		return 2
	}
	return 3
}

// split divides p into at most n parts over disjoint sets of partitions,
// balanced by events, or returns nil when p is to be applied whole.
func (s *Sink) split(p *Prepared, n int) []*Prepared {
	if n < 2 || len(p.positions) < 2 || len(p.early) > 0 || len(p.replay) > 0 || len(p.snapshots) > 0 || len(p.lock) > 0 ||
		len(p.lockTargets) > 0 || p.outside {
		return nil
	}
	if s.mem.anyResized(p.positions) {
		return nil // its parts would take turns on the topic's lock anyway (ledger_topics.go)
	}
	parent := map[change.Partition]change.Partition{}
	var find func(change.Partition) change.Partition
	find = func(x change.Partition) change.Partition {
		px, ok := parent[x]
		if !ok {
			parent[x] = x
			return x
		}
		if px == x {
			return x
		}
		r := find(px)
		parent[x] = r
		return r
	}
	for part := range p.positions {
		find(part)
	}
	events := 0
	for _, tp := range p.plans {
		if len(tp.Truncates) > 0 {
			return nil
		}
		for _, kp := range tp.Order {
			if len(kp.Events) == 0 || kp.NeedsOldKey() {
				return nil
			}
			events += len(kp.Events)
			for _, e := range kp.Events {
				if e.Src == nil {
					return nil
				}
				a, b := find(kp.Events[0].Src.Origin.Partition), find(e.Src.Origin.Partition)
				if a != b {
					parent[b] = a
				}
			}
		}
	}
	if events < s.tune.MinSplitEvents {
		return nil
	}
	weight := map[change.Partition]int{}
	for _, tp := range p.plans {
		for _, kp := range tp.Order {
			weight[find(kp.Events[0].Src.Origin.Partition)] += len(kp.Events)
		}
	}
	var roots []change.Partition
	for part := range parent {
		if find(part) == part {
			roots = append(roots, part)
		}
	}
	if len(roots) < 2 {
		return nil
	}
	// Heaviest first, each to the lightest part so far (ties in a fixed
	// order, so that a retried batch splits alike).
	sort.Slice(roots, func(i, j int) bool {
		if weight[roots[i]] != weight[roots[j]] {
			return weight[roots[i]] > weight[roots[j]]
		}
		return partitionLess(roots[i], roots[j])
	})
	n = min(n, len(roots))
	load := make([]int, n)
	bin := map[change.Partition]int{}
	for _, r := range roots {
		best := 0
		for i := range load {
			if load[i] < load[best] {
				best = i
			}
		}
		bin[r] = best
		load[best] += weight[r]
	}
	used := 0
	for _, l := range load {
		if l > 0 {
			used++
		}
	}
	if used < 2 {
		return nil
	}
	parts := p.group(n, func(_ string, part change.Partition) int {
		if _, ok := parent[part]; !ok {
			return 0 // a dead letter of a partition without offsets
		}
		return bin[find(part)]
	})
	out := parts[:0]
	for _, part := range parts {
		if part != nil {
			out = append(out, part)
		}
	}
	return out
}

func partitionLess(a, b change.Partition) bool {
	if a.Topic != b.Topic {
		return a.Topic < b.Topic
	}
	return a.Partition < b.Partition
}
