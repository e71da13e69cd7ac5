package scdtest

import (
	"math/rand/v2"
	"sort"
	"strconv"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// AddSnapshot gives the scenario's first table a completed full snapshot
// at an unused sequence S: reads at S of a random half of its keys, each
// with its latest image before S, the last one marking the end. It returns
// the table's events up to S and all other events apart.
func AddSnapshot(rng *rand.Rand, sc *Scenario) (before, after []*change.Event, sn sink.Snapshot, ok bool) {
	spec := &sc.Specs[0]
	var mine []*change.Event
	for _, e := range sc.Events {
		if e.Table == spec.Target {
			mine = append(mine, e)
		}
	}
	sort.SliceStable(mine, func(i, j int) bool { return mine[i].Seq.Compare(mine[j].Seq) < 0 })
	var gaps []int
	for i := 0; i+1 < len(mine); i++ {
		a, _ := strconv.ParseInt(mine[i].Seq.Parts()[0], 10, 64)
		b, _ := strconv.ParseInt(mine[i+1].Seq.Parts()[0], 10, 64)
		if b-a >= 2 {
			gaps = append(gaps, i)
		}
	}
	if len(gaps) == 0 {
		return nil, nil, sn, false
	}
	g := gaps[rng.IntN(len(gaps))]
	a, _ := strconv.ParseInt(mine[g].Seq.Parts()[0], 10, 64)
	s, at := change.MustSeq(a+1), mine[g].ValidFrom.Add(time.Minute)
	latest := map[string]*change.Event{}
	var order []string
	for _, e := range mine[:g+1] {
		if e.Key == nil {
			continue
		}
		if _, seen := latest[e.KeyID()]; !seen {
			order = append(order, e.KeyID())
		}
		if e.Op.HasAfter() || latest[e.KeyID()] == nil {
			latest[e.KeyID()] = e
		}
	}
	var reads []*change.Event
	for _, id := range order {
		e := latest[id]
		if e.After == nil || rng.IntN(2) == 0 {
			continue
		}
		after := CopyMap(e.After)
		for c, v := range after {
			if v == change.Unavailable {
				after[c] = nil
			}
		}
		reads = append(reads, &change.Event{Table: spec.Target, Key: e.Key, Seq: s, Op: change.OpRead, ValidFrom: at, After: after})
	}
	if len(reads) == 0 {
		return nil, nil, sn, false
	}
	reads[len(reads)-1].SnapshotEnd = true
	spec.SnapshotDeletes = true
	sc.Events = append(sc.Events, reads...)
	for _, e := range sc.Events {
		if e.Table == spec.Target && e.Seq.Compare(s) <= 0 {
			before = append(before, e)
		} else {
			after = append(after, e)
		}
	}
	return before, after, sink.Snapshot{Target: spec.Target, Seq: s, At: at, Topic: "prop"}, true
}
