package sink

import (
	"context"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/apply"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// Parking a target (DESIGN.md section 6: one table's trouble stays in its
// table). A batch mixes targets; when one target's statements fail in a
// way waiting can cure (ParkTarget), the consumer applies the batch again
// without that target — its events, dead letters, snapshots and the
// offsets of its topics' partitions — and reads the target's partitions
// again once its trouble may be over. Split cuts a prepared batch in two
// along targets. It is safe for the same reason a batch may be applied in
// parts (parallel.go): keys never span targets, offsets are recorded per
// partition, and a partition's topic has one target.

// Targets lists the targets a prepared batch writes or records offsets
// for, each once.
func (p *Prepared) Targets() []string {
	seen := map[string]bool{}
	var out []string
	add := func(t string) {
		if t != "" && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	if p.parts != nil {
		for _, part := range p.parts {
			if !part.committed {
				for _, t := range part.Targets() {
					add(t)
				}
			}
		}
		return out
	}
	for _, t := range p.targets {
		add(t)
	}
	for _, pos := range p.positions {
		add(pos.Target)
	}
	for _, d := range p.dead {
		add(p.deadTarget(d))
	}
	for _, sn := range p.snapshots {
		add(sn.Target)
	}
	for _, e := range p.early {
		add(e.Name)
	}
	return out
}

// HasEvents reports whether the batch applies any event (not only
// offsets or dead letters).
func (p *Prepared) HasEvents() bool {
	if p.parts != nil {
		for _, part := range p.parts {
			if !part.committed && part.HasEvents() {
				return true
			}
		}
		return false
	}
	return len(p.plans) > 0 || len(p.early) > 0
}

// deadTarget is the target a dead letter belongs to: its own, else its
// topic's.
func (p *Prepared) deadTarget(d plan.DeadLetter) string {
	if d.Table != "" {
		return d.Table
	}
	return p.topicTargets[d.Origin.Topic]
}

// Split divides a prepared batch into what belongs to the targets in
// (with) and the rest (without); either may be empty (nil). Parts that
// committed already (parallel.go) are in neither. A batch of dead-letter
// replays is not split (it is all in without).
func (p *Prepared) Split(in func(target string) bool) (without, with *Prepared) {
	if len(p.replay) > 0 {
		return p, nil
	}
	if p.parts != nil {
		var outs, ins []*Prepared
		for _, part := range p.parts {
			if part.committed {
				continue
			}
			o, w := part.Split(in)
			if o != nil {
				outs = append(outs, o)
			}
			if w != nil {
				ins = append(ins, w)
			}
		}
		wrap := func(parts []*Prepared) *Prepared {
			if len(parts) == 0 {
				return nil
			}
			return &Prepared{cut: true, parts: parts}
		}
		return wrap(outs), wrap(ins)
	}
	g := p.group(2, func(target string, _ change.Partition) int {
		if in(target) {
			return 1
		}
		return 0
	})
	return g[0], g[1]
}

// ApplyPart applies a part Split off a batch (or a batch prepared of one
// parked target's events alone) on the calling goroutine,
// while ApplyPrepared applies other batches beside it: its partitions are
// the parked target's alone, disjoint from theirs (the argument of
// parallel.go). It does not reconcile snapshots. As with ApplyPrepared, a
// part that failed may be applied again.
func (s *Sink) ApplyPart(ctx context.Context, p *Prepared) (apply.Result, error) {
	if p.parts == nil {
		return s.applyOne(ctx, p)
	}
	var res apply.Result
	for _, part := range p.parts {
		if part.committed {
			continue
		}
		r, err := s.applyOne(ctx, part)
		res.Add(r)
		if err != nil {
			return res, err
		}
		part.committed = true
	}
	return res, nil
}
