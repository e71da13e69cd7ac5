package sink

import (
	"context"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/apply"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// Cutting a prepared batch.
//
// A prepared batch is cut in two ways: by partitions, into parts applied
// side by side (parallel.go), and by targets, into what a parked target
// holds and the rest (Split, below). Both are the same operation, group, with
// another grouping: each piece of the batch goes to one group, and no
// piece spans two. Both are exact for one reason: a key's events come
// from one partition and write one target, offsets are recorded per
// partition, and a partition's topic has one target, so each group's
// transaction is a batch of its own.

// grouping gives the group of a piece of a batch, from the target it
// writes and the partition it comes from (zero: none, as for a truncate
// or a snapshot).
type grouping func(target string, part change.Partition) int

// group cuts p into n groups by by; groups with nothing to apply are nil.
// Every group keeps p's confirmation and outside mark; the first one
// counts p's type mismatches; dead-letter replays stay with the first
// one (a batch holding them is never cut in practice: split and Split
// refuse it).
func (p *Prepared) group(n int, by grouping) []*Prepared {
	out := make([]*Prepared, n)
	for i := range out {
		out[i] = p.shell()
	}
	out[0].mismatches, out[0].replay = p.mismatches, p.replay
	for _, name := range p.targets { // sorted: so are the groups' targets
		tp := p.plans[name]
		first, whole := -1, true
		for _, kp := range tp.Order {
			g := by(name, kp.Partition())
			if first < 0 {
				first = g
			} else if g != first {
				whole = false
			}
		}
		if first < 0 {
			first = by(name, change.Partition{})
		}
		if whole {
			out[first].plans[name], out[first].targets = tp, append(out[first].targets, name)
			continue
		}
		for _, kp := range tp.Order {
			g := out[by(name, kp.Partition())]
			sub := g.plans[name]
			if sub == nil {
				sub = &plan.TablePlan{Table: tp.Table, Keys: map[string]*plan.KeyPlan{}}
				g.plans[name], g.targets = sub, append(g.targets, name)
			}
			sub.Keys[kp.ID] = kp
			sub.Order = append(sub.Order, kp)
		}
	}
	for part, pos := range p.positions {
		out[by(pos.Target, part)].positions[part] = pos
	}
	for _, part := range p.lock {
		g := out[by(p.topicTargets[part.Topic], part)]
		g.lock = append(g.lock, part)
	}
	for _, d := range p.dead {
		g := out[by(p.deadTarget(d), d.Origin.Partition)]
		g.dead = append(g.dead, d)
	}
	for _, m := range p.marks {
		g := out[by(m.target, m.part)]
		g.marks = append(g.marks, m)
	}
	for _, sn := range p.snapshots {
		g := out[by(sn.Target, change.Partition{})]
		g.snapshots = append(g.snapshots, sn)
	}
	for _, e := range p.early {
		g := out[by(e.Name, change.Partition{})]
		g.early = append(g.early, e)
	}
	for _, name := range p.lockTargets {
		g := out[by(name, change.Partition{})]
		g.lockTargets = append(g.lockTargets, name)
	}
	for i, g := range out {
		if g.empty() {
			out[i] = nil
		}
	}
	return out
}

// empty reports whether p has nothing to apply, record or lock.
func (p *Prepared) empty() bool {
	return len(p.plans) == 0 && len(p.positions) == 0 && len(p.dead) == 0 && len(p.snapshots) == 0 &&
		len(p.early) == 0 && len(p.lock) == 0 && len(p.lockTargets) == 0 && len(p.replay) == 0 && len(p.marks) == 0
}

// shell is a copy of p's batch-wide fields with nothing to apply.
func (p *Prepared) shell() *Prepared {
	return &Prepared{topicTargets: p.topicTargets, confirm: p.confirm, outside: p.outside,
		plans: map[string]*plan.TablePlan{}, positions: map[change.Partition]Position{}}
}

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
