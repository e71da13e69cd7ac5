package sink

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
)

// applyTable applies one table's share of a batch inside tx. It never changes
// p, so a retried transaction starts from the same plan.
func (s *Sink) applyTable(ctx context.Context, tx pgx.Tx, p *tablePlan, ops *cacheOps) (Result, []DeadLetter, error) {
	var res Result
	var dead []DeadLetter
	t := p.t
	truncs, ok := ops.pre.takeTruncates(t)
	pre := ops.pre.takeLatest(t)
	if !ok {
		var err error
		if truncs, err = s.loadTruncates(ctx, tx, t); err != nil {
			return res, nil, err
		}
	}
	known := map[string]bool{}
	for _, tr := range truncs {
		known[string(tr.seq)] = true
	}
	var fresh []change.Seq
	for _, tr := range p.truncates {
		if known[string(tr.seq)] {
			res.Duplicates++
			continue
		}
		known[string(tr.seq)] = true
		if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.scd2sink_truncates (target, scd_seq, valid_from) VALUES ($1, $2, $3)`,
			pgx.Identifier{s.cfg.Schema}.Sanitize()), t.hist.Sanitize(), []byte(tr.seq), tr.t); err != nil {
			return res, nil, fmt.Errorf("recording truncate: %w", err)
		}
		truncs = append(truncs, tr)
		fresh = append(fresh, tr.seq)
		res.Events++
	}
	sortEvents(truncs)
	// Every key with a version live at a new truncate is folded again:
	// the batch's own keys below, the others here, streamed in chunks.
	forced := map[string]*keyPlan{}
	if len(fresh) > 0 {
		if err := s.refoldTruncated(ctx, tx, p, fresh, truncs, forced, ops, &res); err != nil {
			return res, nil, err
		}
	}

	var appendKeys, repair []*keyPlan
	var repairEvents [][]fevent
	batchEvents := map[*keyPlan][]fevent{}
	for _, kp := range p.order {
		evs, d, dups := dedupeBatch(kp.events)
		dead = append(dead, d...)
		res.Duplicates += dups
		batchEvents[kp] = evs
		if forced[kp.id] == nil && len(evs) > 0 { // a key without events (isolation) has nothing to append
			appendKeys = append(appendKeys, kp)
		}
	}
	states := make([]*latest, len(appendKeys))
	var uncached []*keyPlan
	var uncachedAt []int
	for i, kp := range appendKeys {
		if l, ok := s.cached(cacheKey{t, kp.id}, &ops.boxes, &ops.mem); ok {
			states[i] = l
		} else {
			uncached, uncachedAt = append(uncached, kp), append(uncachedAt, i)
		}
	}
	loaded, err := t.loadLatest(ctx, tx, uncached, pre)
	if err != nil {
		return res, nil, err
	}
	for j, i := range uncachedAt {
		states[i] = &loaded[j]
	}
	w := &writes{pre: ops.pre}
	var repairFrom []change.Seq
	partial := false
	for i, kp := range appendKeys {
		evs := batchEvents[kp]
		if max := states[i].maxSeq(); max != nil && evs[0].seq.Compare(max) <= 0 {
			repair = append(repair, kp)
			repairEvents = append(repairEvents, evs)
			// A late event changes the history from the version live at
			// its sequence on: that part is read and folded again, not
			// the key's whole history (repairKey).
			repairFrom, partial = append(repairFrom, evs[0].seq), true
			continue
		}
		ops.set(cacheKey{t, kp.id}, s.appendKey(t, kp, evs, states[i], truncs, w, &res))
	}
	for _, kp := range forced {
		repair = append(repair, kp)
		repairEvents = append(repairEvents, batchEvents[kp])
		repairFrom = append(repairFrom, nil)
	}
	for _, kp := range repair {
		ops.drop = append(ops.drop, cacheKey{t, kp.id})
	}
	if !partial || wholeRepairs {
		repairFrom = nil
	}
	var bounds []bound
	if repairFrom != nil && !unboundedRepairs {
		bounds = make([]bound, len(repair))
		for i, evs := range repairEvents {
			if repairFrom[i] != nil && !truncatedAfter(truncs, evs[0].seq) {
				bounds[i] = boundOf(evs)
			}
		}
	}
	hists, err := t.loadHistoryFrom(ctx, tx, repair, repairFrom, bounds)
	if err != nil {
		return res, nil, err
	}
	for _, h := range hists {
		res.RepairVersionsRead += len(h.versions)
		res.RepairSideRowsRead += len(h.side)
	}
	for i, kp := range repair {
		d, ok := s.repairKey(t, kp, repairEvents[i], hists[i], truncs, forced[kp.id] != nil, w, &res)
		if !ok {
			// The boundary would have moved: read on to the end.
			again, err := t.loadHistoryFrom(ctx, tx, repair[i:i+1], repairFrom[i:i+1], nil)
			if err != nil {
				return res, nil, err
			}
			res.RepairVersionsRead += len(again[0].versions)
			res.RepairSideRowsRead += len(again[0].side)
			d, _ = s.repairKey(t, kp, repairEvents[i], again[0], truncs, forced[kp.id] != nil, w, &res)
		}
		for _, l := range d {
			if l.Reason == ReasonExpired {
				res.Expired++
			}
		}
		dead = append(dead, d...)
	}
	if err := w.exec(ctx, tx, t); err != nil {
		return res, nil, err
	}
	return res, dead, nil
}

// wholeRepairs makes every repair read its key's whole history, and
// unboundedRepairs every partial one read on to the end (tests compare
// the ways).
var wholeRepairs, unboundedRepairs = false, false

// boundedRepairs counts repairs that stopped at a boundary (tests see that
// the path is taken).
var boundedRepairs atomic.Int64

// truncatedAfter reports whether a truncate comes after seq (at seq too: a
// key's event comes before a truncate of the same sequence): a late event
// before it may change whether it closes something, and so the time of
// everything after it (no boundary then).
func truncatedAfter(truncs []fevent, seq change.Seq) bool {
	return len(truncs) > 0 && truncs[len(truncs)-1].seq.Compare(seq) >= 0
}

// boundOf is the bound of a key's late events (sorted by sequence).
func boundOf(evs []fevent) bound {
	b := bound{last: evs[len(evs)-1].seq}
	for _, e := range evs {
		at := e.t
		if !e.raw.IsZero() {
			at = e.raw
		}
		if at.After(b.latest) {
			b.latest = at
		}
	}
	return b
}

// dedupeBatch drops repeated events of one key inside a batch: the same
// sequence with the same content is a duplicate, with other content a
// conflict (the first one wins).
func dedupeBatch(evs []fevent) ([]fevent, []DeadLetter, int) {
	repeated := false
	for i := 1; i < len(evs) && !repeated; i++ {
		repeated = evs[i-1].seq.Compare(evs[i].seq) == 0
	}
	if !repeated {
		return evs, nil, 0 // the common case: nothing to drop, nothing copied
	}
	var out []fevent
	var dead []DeadLetter
	dups := 0
	for _, e := range evs {
		if n := len(out); n > 0 && out[n-1].seq.Compare(e.seq) == 0 {
			if bytes.Equal(out[n-1].hash, e.hash) {
				dups++
			} else {
				dead = append(dead, conflictLetter(e))
			}
			continue
		}
		out = append(out, e)
	}
	return out, dead, dups
}

func conflictLetter(e fevent) DeadLetter {
	return eventDeadLetter(e.src, ReasonConflict, fmt.Errorf("conflict: key %v sequence %s already has an event with other content; the first one applied wins",
		e.src.Key, e.seq))
}

// mergeTruncates adds the truncates after seq `after` (all when nil) to evs.
func mergeTruncates(evs, truncs []fevent, after change.Seq) []fevent {
	var add []fevent
	for _, tr := range truncs {
		if after == nil || tr.seq.Compare(after) > 0 {
			add = append(add, tr)
		}
	}
	if len(add) == 0 {
		return evs
	}
	out := append(append([]fevent(nil), evs...), add...)
	sortEvents(out)
	return out
}

// appendKey folds events that all come after everything the table holds for
// the key: only the latest version can change. It returns what the table
// will hold for the key once the batch commits.
func (s *Sink) appendKey(t *table, kp *keyPlan, evs []fevent, l *latest, truncs []fevent, w *writes, res *Result) *latest {
	st := foldState{w: w}
	var orig *version
	if v := l.v; v != nil {
		st.prevRow, st.prevT, st.hasPrev = v.row, v.from, true
		if v.closed && v.to.After(st.prevT) {
			st.prevT = v.to
		}
		if !v.closed {
			orig = v
			live := v.clone(w)
			live.opener = v.row
			st.live = live
		}
	}
	if l.sideMaxT != nil && (!st.hasPrev || l.sideMaxT.After(st.prevT)) {
		st.prevT, st.hasPrev = *l.sideMaxT, true
	}
	res.noteDisagreements(t.spec.Target, evs, st.prevT)
	out := t.fold(&st, mergeTruncates(evs, truncs, l.maxSeq()))
	for _, v := range out.versions {
		v.key = kp.key
	}
	spread := t.spec.Type1Scope == AllVersions && st.prevRow != nil
	if spread {
		t.spreadType1(out.versions, st.prevRow)
	}
	rewritten := false // the live version is rewritten whole
	for _, v := range out.versions {
		switch {
		case !v.stored:
			w.insVersions = append(w.insVersions, v)
		case !slices.Equal(v.absent, orig.absent) || v.complete != orig.complete || !rowsEqual(v.row, orig.row, t.trkIdx) ||
			(!spread && !rowsEqual(v.row, orig.row, t.t1Idx)):
			// (A column learned as NULL changes no value, but what the
			// version knows: it is written, or a restart would not know it.)
			w.full = append(w.full, v)
			rewritten = true
		case v.closed:
			// Its Type 1 values, if they changed, come with the key's
			// other versions' below.
			w.closeOnly = append(w.closeOnly, v)
		}
		if t.openerDiffers(v) && !(v.stored && l.openerSaved) {
			w.insSide = append(w.insSide, sideRow{key: kp.key, ev: v.event(v.opener, v.openAbsent)})
		}
	}
	if spread && l.v != nil && !rowsEqual(st.prevRow, l.v.row, t.t1Idx) {
		var below change.Seq
		if rewritten {
			below = orig.seq // the live version is rewritten below
		}
		w.t1Bulk = append(w.t1Bulk, t1Row{key: kp.key, row: st.prevRow, below: below})
	}
	for _, e := range out.side {
		w.insSide = append(w.insSide, sideRow{key: kp.key, ev: e})
	}
	res.Events += len(evs)
	res.VersionsOpened += out.opened
	res.VersionsClosed += out.closed

	next := w.slabs().latest()
	*next = latest{v: l.v, openerSaved: l.openerSaved, sideMaxSeq: l.sideMaxSeq, sideMaxT: l.sideMaxT}
	if n := len(out.versions); n > 0 {
		last := out.versions[n-1]
		next.v = w.slabs().version()
		*next.v = *last // its row is not copied: ops.set packs (or detaches) the state at once
		next.v.stored = true
		next.openerSaved = (last.stored && l.openerSaved) || t.openerDiffers(last)
		next.v.opener = nil // appendKey takes the opener from the row (or the side table)
		next.v.openAbsent = next.v.absent
	} else if l.v != nil && t.spec.Type1Scope == AllVersions && st.prevRow != nil {
		next.v = l.v.clone(w) // its Type 1 columns changed with the key's
		t.spreadType1([]*version{next.v}, st.prevRow)
	}
	if n := len(out.side); n > 0 {
		next.sideMaxSeq = out.side[n-1].seq
		next.setSideMaxT(out.side[n-1].t)
	}
	return next
}

// repairKey rebuilds a key's event list from its versions and side rows,
// adds the batch's new events, folds it from the start and writes the
// difference. Events already in the table are duplicates or conflicts.
//
// Read up to a boundary (h.until), the fold must open the boundary's
// version as the table holds it, at the same time: then nothing after it
// changes and it is left as it is. If not, repairKey writes nothing and
// returns false: the caller reads on to the end and repairs again.
func (s *Sink) repairKey(t *table, kp *keyPlan, batch []fevent, h history, truncs []fevent, forced bool, w *writes, res *Result) ([]DeadLetter, bool) {
	var dead []DeadLetter
	dups := 0
	defer func() { res.Duplicates += dups }()
	existing := map[string][]byte{}
	var evs []fevent
	// Read from h.from on, the first event starts the fold: its row is
	// taken as resolved (its unavailable values were resolved from events
	// not read), and what it opened is what the table holds.
	// After a retention horizon (retention.go), the first event left
	// starts the fold likewise, and events before it are dropped: what
	// they could change is gone.
	var first change.Seq
	if h.horizon != nil {
		for _, e := range h.side {
			if first == nil || e.seq.Compare(first) < 0 {
				first = e.seq
			}
		}
		for _, v := range h.versions {
			if first == nil || v.seq.Compare(first) < 0 {
				first = v.seq
			}
		}
		var expired []DeadLetter
		batch, expired = t.afterHorizon(batch, h.horizon, first)
		dead = append(dead, expired...)
		truncs = slices.DeleteFunc(slices.Clone(truncs), func(tr fevent) bool { return !afterHorizon(tr.seq, h.horizon, first) })
	}
	placeholders := func(e fevent) fevent {
		if (h.from != nil && e.seq.Compare(h.from) == 0) || (first != nil && e.seq.Compare(first) == 0) {
			e.resolved = true // its clamped time too: the events before it are not read
			return e
		}
		return t.withPlaceholders(e)
	}
	for _, e := range h.side {
		existing[string(e.seq)] = e.hash
		evs = append(evs, placeholders(e))
	}
	for _, v := range h.versions {
		if _, ok := existing[string(v.seq)]; !ok {
			existing[string(v.seq)] = v.hash
			evs = append(evs, placeholders(v.event(v.row, v.absent)))
		}
	}
	var fresh []fevent
	for _, e := range batch {
		if hash, ok := existing[string(e.seq)]; ok {
			if bytes.Equal(hash, e.hash) {
				dups++
			} else {
				dead = append(dead, conflictLetter(e))
			}
			continue
		}
		evs = append(evs, e)
		fresh = append(fresh, e)
	}
	if len(fresh) == 0 && !forced {
		return dead, true
	}
	note := repairNote{key: kp.key, cause: repairCause(fresh, truncs)}
	var touched []change.Seq
	for _, tr := range truncs {
		if h.from == nil || tr.seq.Compare(h.from) >= 0 { // at h.from: after its event
			evs = append(evs, tr)
		}
	}
	sortEvents(evs)
	st := foldState{w: w}
	out := t.fold(&st, evs)
	var boundary *version // as the table holds it
	if h.until != nil {
		var folded *version
		kept := make([]*version, 0, len(out.versions))
		for _, v := range out.versions {
			switch v.seq.Compare(h.until) {
			case 0:
				folded = v
			case -1:
				kept = append(kept, v)
			}
		}
		for _, v := range h.versions {
			if v.seq.Compare(h.until) == 0 {
				boundary = v
			}
		}
		// (Under all_versions the versions read must hold the boundary's
		// Type 1 values, as the key's last event gave them: not so after a
		// change of type1_scope without a rebuild, which the whole fold
		// puts right.)
		if folded == nil || boundary == nil || !folded.from.Equal(boundary.from) || !rowsEqual(folded.row, boundary.row, t.trkIdx) ||
			(t.spec.Type1Scope == AllVersions && !rowsEqual(h.versions[0].row, boundary.row, t.t1Idx)) {
			dups = 0
			return nil, false
		}
		out.versions = kept
		boundedRepairs.Add(1)
	}
	for _, v := range out.versions {
		v.key = kp.key
	}
	res.noteDisagreements(t.spec.Target, evs, time.Time{})
	if t.spec.Type1Scope == AllVersions && boundary != nil {
		// The key's last event is past the boundary, unchanged: every
		// version holds its Type 1 values, the boundary's too.
		t.spreadType1(out.versions, boundary.row)
	} else if t.spec.Type1Scope == AllVersions {
		t.spreadType1(out.versions, st.prevRow)
		// Read from h.from on, the fold ends with the key's last row
		// (every row-bearing event from there is read): when its Type 1
		// values differ from those all versions hold, the versions not
		// read get them too.
		if h.from != nil && len(h.versions) > 0 && st.prevRow != nil && !rowsEqual(st.prevRow, h.versions[0].row, t.t1Idx) {
			w.t1Bulk = append(w.t1Bulk, t1Row{key: kp.key, row: st.prevRow, below: h.from})
			note.below = h.from // audited too: every version under it changes
		}
	}
	want := out.side
	for _, v := range out.versions {
		if t.openerDiffers(v) {
			want = append(want, v.event(v.opener, v.openAbsent))
		}
	}
	old := map[string]*version{}
	for _, v := range h.versions {
		if v != boundary {
			old[string(v.seq)] = v
		}
	}
	for _, v := range out.versions {
		o := old[string(v.seq)]
		if o == nil {
			w.insVersions = append(w.insVersions, v)
			touched = append(touched, v.seq)
			res.VersionsOpened++
			continue
		}
		delete(old, string(v.seq))
		v.id, v.stored = o.id, true
		if !v.sameAs(o) {
			w.full = append(w.full, v)
			touched = append(touched, v.seq)
			if v.closed && !o.closed {
				res.VersionsClosed++
			}
		}
	}
	for _, o := range old {
		w.delVersions = append(w.delVersions, o.id)
		touched = append(touched, o.seq)
	}
	note.noteTouched(touched)
	w.repairs = append(w.repairs, note)
	oldSide := map[string]fevent{}
	for _, e := range h.side {
		if h.until == nil || e.seq.Compare(h.until) < 0 { // the boundary's saved opener stays
			oldSide[string(e.seq)] = e
		}
	}
	for _, e := range want {
		if o, ok := oldSide[string(e.seq)]; ok {
			delete(oldSide, string(e.seq))
			if sameSide(o, e) {
				continue
			}
			w.delSide = append(w.delSide, sideRow{key: kp.key, ev: o})
		}
		w.insSide = append(w.insSide, sideRow{key: kp.key, ev: e})
	}
	for _, o := range oldSide {
		w.delSide = append(w.delSide, sideRow{key: kp.key, ev: o})
	}
	res.Events += len(fresh)
	res.Repaired++
	return dead, true
}

// withPlaceholders returns a rebuilt event whose placeholder columns hold the
// placeholder again (on a copy of its row).
func (t *table) withPlaceholders(e fevent) fevent {
	if e.row == nil {
		return e
	}
	e.row = append([]any(nil), e.row...)
	for _, name := range e.unavail {
		if i, ok := t.colIdx[name]; ok {
			e.row[i] = unavailable{}
		}
	}
	return e
}

func sameSide(a, b fevent) bool {
	if a.op != b.op || a.complete != b.complete || !slices.Equal(a.unavail, b.unavail) || !slices.Equal(a.absent, b.absent) || !a.t.Equal(b.t) || !a.raw.Equal(b.raw) || !bytes.Equal(a.hash, b.hash) || (a.row == nil) != (b.row == nil) {
		return false
	}
	for i := range a.row {
		if !valuesEqual(a.row[i], b.row[i]) {
			return false
		}
	}
	return true
}
