package apply

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/history"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// Table applies one table's share of a batch inside tx. It never changes
// p, so a retried transaction starts from the same plan.
func (a *Applier) Table(ctx context.Context, tx pgx.Tx, p *plan.TablePlan, ops *Ops) (Result, []plan.DeadLetter, error) {
	var res Result
	var dead []plan.DeadLetter
	t := p.Table
	truncs, ok := ops.Pre.TakeTruncates(t)
	pre := ops.Pre.TakeLatest(t)
	if !ok {
		var err error
		if truncs, err = history.LoadTruncates(ctx, tx, a.schema, t); err != nil {
			return res, nil, err
		}
	}
	known := map[string]bool{}
	for _, tr := range truncs {
		known[string(tr.Seq)] = true
	}
	var fresh []change.Seq
	for _, tr := range p.Truncates {
		if known[string(tr.Seq)] {
			res.Duplicates++
			continue
		}
		known[string(tr.Seq)] = true
		recorded, err := history.RecordTruncate(ctx, tx, a.schema, t.Hist.Sanitize(), tr.Seq, tr.T)
		if err != nil {
			return res, nil, err
		}
		// One another writer recorded meanwhile (it committed: the insert
		// waited for it) is folded here too; it closes nothing new.
		truncs = append(truncs, tr)
		fresh = append(fresh, tr.Seq)
		if recorded {
			res.Events++
		} else {
			res.Duplicates++
		}
	}
	plan.SortEvents(truncs)
	// Every key with a version live at a new truncate is folded again:
	// the batch's own keys below, the others here, streamed in chunks.
	forced := map[string]*plan.KeyPlan{}
	if len(fresh) > 0 {
		if err := a.refoldTruncated(ctx, tx, p, fresh, truncs, forced, ops, &res); err != nil {
			return res, nil, err
		}
	}

	appendKeys := make([]*plan.KeyPlan, 0, len(p.Order))
	var repair []*plan.KeyPlan
	var repairEvents [][]fold.Event
	batchEvents := make(map[*plan.KeyPlan][]fold.Event, len(p.Order))
	for _, kp := range p.Order {
		evs, d, dups := dedupeBatch(kp.Events)
		dead = append(dead, d...)
		res.Duplicates += dups
		batchEvents[kp] = evs
		if forced[kp.ID] == nil && len(evs) > 0 { // a key without events (isolation) has nothing to append
			appendKeys = append(appendKeys, kp)
		}
	}
	states := make([]*fold.Latest, len(appendKeys))
	var uncached []*plan.KeyPlan
	var uncachedAt []int
	for i, kp := range appendKeys {
		if l, ok := a.cached(t.CacheKey(kp.ID), &ops.mem.Boxes, &ops.mem); ok {
			states[i] = l
		} else {
			uncached, uncachedAt = append(uncached, kp), append(uncachedAt, i)
		}
	}
	loaded, err := history.LoadLatest(ctx, tx, t, uncached, pre)
	if err != nil {
		return res, nil, err
	}
	for j, i := range uncachedAt {
		states[i] = &loaded[j]
	}
	var repairFrom []change.Seq
	partial := false
	appending, appendStates := make([]*plan.KeyPlan, 0, len(appendKeys)), make([]*fold.Latest, 0, len(appendKeys))
	for i, kp := range appendKeys {
		evs := batchEvents[kp]
		if max := states[i].MaxSeq(); max != nil && evs[0].Seq.Compare(max) <= 0 {
			repair = append(repair, kp)
			repairEvents = append(repairEvents, evs)
			// A late event changes the history from the version live at
			// its sequence on: that part is read and folded again, not
			// the key's whole history (repairKey).
			repairFrom, partial = append(repairFrom, evs[0].Seq), true
			continue
		}
		appending, appendStates = append(appending, kp), append(appendStates, states[i])
	}
	if err := history.ReadPrevAbsent(ctx, tx, t, appending, appendStates, batchEvents); err != nil {
		return res, nil, err
	}
	w := &history.Writes{Pre: ops.Pre}
	if !ops.Off {
		ops.Puts = slices.Grow(ops.Puts, len(appending))
	}
	for i, kp := range appending {
		l := a.appendKey(t, kp, batchEvents[kp], appendStates[i], truncs, w, &res)
		if t.Spec.Retention > 0 && (l == nil || l.V == nil || l.V.Closed) {
			// Nothing current: a retention pass may remove what the
			// state holds without telling the writers (retention.go).
			ops.Drops = append(ops.Drops, t.CacheKey(kp.ID))
			continue
		}
		ops.Set(t.CacheKey(kp.ID), l)
	}
	for _, kp := range forced {
		repair = append(repair, kp)
		repairEvents = append(repairEvents, batchEvents[kp])
		repairFrom = append(repairFrom, nil)
	}
	for _, kp := range repair {
		ops.Drops = append(ops.Drops, t.CacheKey(kp.ID))
	}
	if !partial || a.tune.WholeRepairs {
		repairFrom = nil
	}
	var bounds []history.Bound
	if repairFrom != nil && !a.tune.UnboundedRepairs {
		bounds = make([]history.Bound, len(repair))
		for i, evs := range repairEvents {
			if repairFrom[i] != nil && !truncatedAfter(truncs, evs[0].Seq) {
				bounds[i] = boundOf(evs)
			}
		}
	}
	hists, err := history.LoadFrom(ctx, tx, t, repair, repairFrom, bounds)
	if err != nil {
		return res, nil, err
	}
	for _, h := range hists {
		res.RepairVersionsRead += len(h.Versions)
		res.RepairSideRowsRead += len(h.Side)
	}
	for i, kp := range repair {
		d, ok := a.repairKey(t, kp, repairEvents[i], hists[i], truncs, forced[kp.ID] != nil, w, &res)
		if !ok {
			// The boundary would have moved: read on to the end.
			again, err := history.LoadFrom(ctx, tx, t, repair[i:i+1], repairFrom[i:i+1], nil)
			if err != nil {
				return res, nil, err
			}
			res.RepairVersionsRead += len(again[0].Versions)
			res.RepairSideRowsRead += len(again[0].Side)
			d, _ = a.repairKey(t, kp, repairEvents[i], again[0], truncs, forced[kp.ID] != nil, w, &res)
		}
		for _, l := range d {
			if l.Reason == plan.ReasonExpired {
				// Its whole effect lies before what retention kept:
				// counted and logged, never stored (DESIGN.md section 12).
				res.noteExpired(t.Spec.Target, l)
				continue
			}
			dead = append(dead, l)
		}
	}
	if err := w.Exec(ctx, tx, t, ops.Later); err != nil {
		return res, nil, err
	}
	return res, dead, nil
}

// truncatedAfter reports whether a truncate comes after seq (at seq too: a
// key's event comes before a truncate of the same sequence): a late event
// before it may change whether it closes something, and so the time of
// everything after it (no boundary then).
func truncatedAfter(truncs []fold.Event, seq change.Seq) bool {
	return len(truncs) > 0 && truncs[len(truncs)-1].Seq.Compare(seq) >= 0
}

// boundOf is the bound of a key's late events (sorted by sequence).
func boundOf(evs []fold.Event) history.Bound {
	b := history.Bound{Last: evs[len(evs)-1].Seq}
	for _, e := range evs {
		at := e.T
		if !e.Raw.IsZero() {
			at = e.Raw
		}
		if at.After(b.Latest) {
			b.Latest = at
		}
	}
	return b
}

// dedupeBatch drops repeated events of one key inside a batch: the same
// sequence with the same content is a duplicate, with other content a
// conflict (the first one wins).
func dedupeBatch(evs []fold.Event) ([]fold.Event, []plan.DeadLetter, int) {
	repeated := false
	for i := 1; i < len(evs) && !repeated; i++ {
		repeated = evs[i-1].Seq.Compare(evs[i].Seq) == 0
	}
	if !repeated {
		return evs, nil, 0 // the common case: nothing to drop, nothing copied
	}
	var out []fold.Event
	var dead []plan.DeadLetter
	dups := 0
	for _, e := range evs {
		if n := len(out); n > 0 && out[n-1].Seq.Compare(e.Seq) == 0 {
			if bytes.Equal(out[n-1].Hash, e.Hash) {
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

func conflictLetter(e fold.Event) plan.DeadLetter {
	return plan.EventDeadLetter(e.Src, plan.ReasonConflict, fmt.Errorf("conflict: key %v sequence %s already has an event with other content; the first one applied wins",
		e.Src.Key, e.Seq))
}

// mergeTruncates adds the truncates after seq `after` (all when nil) to evs.
func mergeTruncates(evs, truncs []fold.Event, after change.Seq) []fold.Event {
	var add []fold.Event
	for _, tr := range truncs {
		if after == nil || tr.Seq.Compare(after) > 0 {
			add = append(add, tr)
		}
	}
	if len(add) == 0 {
		return evs
	}
	out := append(append([]fold.Event(nil), evs...), add...)
	plan.SortEvents(out)
	return out
}

// appendKey folds events that all come after everything the table holds for
// the key: only the latest version can change. It returns what the table
// will hold for the key once the batch commits.
func (a *Applier) appendKey(t *plan.Table, kp *plan.KeyPlan, evs []fold.Event, l *fold.Latest, truncs []fold.Event, w *history.Writes, res *Result) *fold.Latest {
	st := fold.State{Mem: w.Slabs()}
	var orig *fold.Version
	var prevSeq change.Seq // the event that set st.PrevT
	if v := l.V; v != nil {
		st.PrevRow, st.PrevT, st.HasPrev = l.PrevImage(&t.Shape, w.Slabs()), v.From, true
		prevSeq = v.Seq
		if v.Closed && v.To.After(st.PrevT) {
			st.PrevT, prevSeq = v.To, v.CloseSeq
		}
		if !v.Closed {
			orig = v
			live := v.Clone(w.Slabs())
			live.Opener = v.Row
			st.Live = live
		}
	}
	if l.SideMaxT != nil && (!st.HasPrev || l.SideMaxT.After(st.PrevT)) {
		st.PrevT, st.HasPrev, prevSeq = *l.SideMaxT, true, l.SideMaxSeq
	}
	res.noteDisagreements(t.Spec.Target, evs, st.PrevT, prevSeq)
	merged := mergeTruncates(evs, truncs, l.MaxSeq())
	out := t.Fold(&st, merged)
	for _, v := range out.Versions {
		v.Key = kp.Key
	}
	// A truncate the state does not know of may have closed the key's
	// stored version in the table already (another member's batch):
	// where its closed versions end is not known then.
	since := l.ClosedFrom
	if l.V != nil && len(merged) > len(evs) {
		since = time.Time{}
	}
	spread := t.Spec.Type1Scope == fold.AllVersions && st.PrevRow != nil
	if spread {
		t.SpreadType1(out.Versions, st.PrevRow)
	}
	rewritten := false // the live version is rewritten whole
	for _, v := range out.Versions {
		switch {
		case !v.Stored:
			w.InsVersions = append(w.InsVersions, v)
		case !slices.Equal(v.Absent, orig.Absent) || v.Complete != orig.Complete || !fold.RowsEqual(v.Row, orig.Row, t.Tracked) ||
			(!spread && !fold.RowsEqual(v.Row, orig.Row, t.Type1)):
			// (A column learned as NULL changes no value, but what the
			// version knows: it is written, or a restart would not know it.)
			w.Full = append(w.Full, v)
			rewritten = true
		case v.Closed:
			// Its Type 1 values, if they changed, come with the key's
			// other versions' below.
			w.CloseOnly = append(w.CloseOnly, v)
		}
		if t.OpenerDiffers(v) && !(v.Stored && l.OpenerSaved) {
			w.InsSide = append(w.InsSide, history.SideRow{Key: kp.Key, Event: v.Event(v.Opener, v.OpenAbsent)})
		}
	}
	if spread && l.V != nil && !fold.RowsEqual(st.PrevRow, l.V.Row, t.Type1) {
		var below change.Seq
		if rewritten {
			below = orig.Seq // the live version is rewritten below
		}
		w.T1Bulk = append(w.T1Bulk, history.T1Row{Key: kp.Key, Row: st.PrevRow, Below: below, Since: since})
	}
	for _, e := range out.Side {
		w.InsSide = append(w.InsSide, history.SideRow{Key: kp.Key, Event: e})
	}
	res.Events += len(evs)
	res.VersionsOpened += out.Opened
	res.VersionsClosed += out.Closed

	next := w.Slabs().Latest()
	*next = fold.Latest{V: l.V, OpenerSaved: l.OpenerSaved, SideMaxSeq: l.SideMaxSeq, SideMaxT: l.SideMaxT, ClosedFrom: since}
	for _, v := range out.Versions {
		next.NoteClosed(v)
	}
	next.PrevAbsent, next.PrevKnown = fold.LastImage(evs, l.PrevAbsent, l.PrevKnown)
	if n := len(out.Versions); n > 0 {
		last := out.Versions[n-1]
		next.V = w.Slabs().Version()
		*next.V = *last // its row is not copied: ops.set packs (or detaches) the state at once
		next.V.Stored = true
		next.OpenerSaved = (last.Stored && l.OpenerSaved) || t.OpenerDiffers(last)
		next.V.Opener = nil // appendKey takes the opener from the row (or the side table)
		next.V.OpenAbsent = next.V.Absent
		w.NoteClosedLatest(t, kp.Key, next.V)
	} else if l.V != nil && t.Spec.Type1Scope == fold.AllVersions && st.PrevRow != nil {
		next.V = l.V.Clone(w.Slabs()) // its Type 1 columns changed with the key's
		t.SpreadType1([]*fold.Version{next.V}, st.PrevRow)
	}
	if n := len(out.Side); n > 0 {
		next.SideMaxSeq = out.Side[n-1].Seq
		next.SetSideMaxT(out.Side[n-1].T)
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
func (a *Applier) repairKey(t *plan.Table, kp *plan.KeyPlan, batch []fold.Event, h history.KeyHistory, truncs []fold.Event, forced bool, w *history.Writes, res *Result) ([]plan.DeadLetter, bool) {
	var dead []plan.DeadLetter
	dups := 0
	defer func() { res.Duplicates += dups }()
	existing := map[string][]byte{}
	var evs []fold.Event
	// Read from h.from on, the first event starts the fold: its row is
	// taken as resolved (its unavailable values were resolved from events
	// not read), and what it opened is what the table holds.
	// After a retention horizon (retention.go), the first event left
	// starts the fold likewise, and events before it are dropped: what
	// they could change is gone.
	var first change.Seq
	if h.Horizon != nil {
		for _, e := range h.Side {
			if first == nil || e.Seq.Compare(first) < 0 {
				first = e.Seq
			}
		}
		for _, v := range h.Versions {
			if first == nil || v.Seq.Compare(first) < 0 {
				first = v.Seq
			}
		}
		var expired []plan.DeadLetter
		batch, expired = expiredOf(t, batch, h.Horizon, first)
		dead = append(dead, expired...)
		truncs = slices.DeleteFunc(slices.Clone(truncs), func(tr fold.Event) bool { return !afterHorizon(tr.Seq, h.Horizon, first) })
	}
	placeholders := func(e fold.Event) fold.Event {
		if (h.From != nil && e.Seq.Compare(h.From) == 0) || (first != nil && e.Seq.Compare(first) == 0) {
			e.Resolved = true // its clamped time too: the events before it are not read
			return e
		}
		return t.WithPlaceholders(e)
	}
	for _, e := range h.Side {
		existing[string(e.Seq)] = e.Hash
		evs = append(evs, placeholders(e))
	}
	for _, v := range h.Versions {
		if _, ok := existing[string(v.Seq)]; !ok {
			existing[string(v.Seq)] = v.Hash
			evs = append(evs, placeholders(v.Event(v.Row, v.Absent)))
		}
	}
	var fresh []fold.Event
	for _, e := range batch {
		if hash, ok := existing[string(e.Seq)]; ok {
			if bytes.Equal(hash, e.Hash) {
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
	note := history.RepairNote{Key: kp.Key, Cause: history.RepairCause(fresh, truncs)}
	var touched []change.Seq
	for _, tr := range truncs {
		if h.From == nil || tr.Seq.Compare(h.From) >= 0 { // at h.from: after its event
			evs = append(evs, tr)
		}
	}
	plan.SortEvents(evs)
	st := fold.State{Mem: w.Slabs()}
	out := t.Fold(&st, evs)
	var boundary *fold.Version // as the table holds it
	if h.Until != nil {
		var folded *fold.Version
		kept := make([]*fold.Version, 0, len(out.Versions))
		for _, v := range out.Versions {
			switch v.Seq.Compare(h.Until) {
			case 0:
				folded = v
			case -1:
				kept = append(kept, v)
			}
		}
		for _, v := range h.Versions {
			if v.Seq.Compare(h.Until) == 0 {
				boundary = v
			}
		}
		// (Under all_versions the versions read must hold the boundary's
		// Type 1 values, as the key's last event gave them: not so after a
		// change of type1_scope without a rebuild, which the whole fold
		// puts right.)
		if folded == nil || boundary == nil || !folded.From.Equal(boundary.From) || !fold.RowsEqual(folded.Row, boundary.Row, t.Tracked) ||
			(t.Spec.Type1Scope == fold.AllVersions && !fold.RowsEqual(h.Versions[0].Row, boundary.Row, t.Type1)) {
			dups = 0
			return nil, false
		}
		out.Versions = kept
		a.bounded.Add(1)
	}
	for _, v := range out.Versions {
		v.Key = kp.Key
	}
	res.noteDisagreements(t.Spec.Target, evs, time.Time{}, nil)
	if t.Spec.Type1Scope == fold.AllVersions && boundary != nil {
		// The key's last event is past the boundary, unchanged: every
		// version holds its Type 1 values, the boundary's too.
		t.SpreadType1(out.Versions, boundary.Row)
	} else if t.Spec.Type1Scope == fold.AllVersions {
		t.SpreadType1(out.Versions, st.PrevRow)
		// Read from h.from on, the fold ends with the key's last row
		// (every row-bearing event from there is read): when its Type 1
		// values differ from those all versions hold, the versions not
		// read get them too.
		if h.From != nil && len(h.Versions) > 0 && st.PrevRow != nil && !fold.RowsEqual(st.PrevRow, h.Versions[0].Row, t.Type1) {
			w.T1Bulk = append(w.T1Bulk, history.T1Row{Key: kp.Key, Row: st.PrevRow, Below: h.From})
			note.Below = h.From // audited too: every version under it changes
		}
	}
	want := out.Side
	for _, v := range out.Versions {
		if t.OpenerDiffers(v) {
			want = append(want, v.Event(v.Opener, v.OpenAbsent))
		}
	}
	old := map[string]*fold.Version{}
	for _, v := range h.Versions {
		if v != boundary {
			old[string(v.Seq)] = v
		}
	}
	for _, v := range out.Versions {
		o := old[string(v.Seq)]
		if o == nil {
			w.InsVersions = append(w.InsVersions, v)
			touched = append(touched, v.Seq)
			res.VersionsOpened++
			continue
		}
		delete(old, string(v.Seq))
		v.ID, v.Stored = o.ID, true
		if !v.SameAs(o) {
			w.Full = append(w.Full, v)
			touched = append(touched, v.Seq)
			if v.Closed && !o.Closed {
				res.VersionsClosed++
			}
		}
	}
	for _, o := range old {
		w.DelVersions = append(w.DelVersions, o.ID)
		touched = append(touched, o.Seq)
	}
	if h.Until == nil && len(out.Versions) > 0 { // (with a boundary, the latest stays as it is)
		w.NoteClosedLatest(t, kp.Key, out.Versions[len(out.Versions)-1])
	}
	note.NoteTouched(touched)
	w.Repairs = append(w.Repairs, note)
	oldSide := map[string]fold.Event{}
	for _, e := range h.Side {
		if h.Until == nil || e.Seq.Compare(h.Until) < 0 { // the boundary's saved opener stays
			oldSide[string(e.Seq)] = e
		}
	}
	for _, e := range want {
		if o, ok := oldSide[string(e.Seq)]; ok {
			delete(oldSide, string(e.Seq))
			if sameSide(o, e) {
				continue
			}
			w.DelSide = append(w.DelSide, history.SideRow{Key: kp.Key, Event: o})
		}
		w.InsSide = append(w.InsSide, history.SideRow{Key: kp.Key, Event: e})
	}
	for _, o := range oldSide {
		w.DelSide = append(w.DelSide, history.SideRow{Key: kp.Key, Event: o})
	}
	res.Events += len(fresh)
	res.Repaired++
	return dead, true
}

func sameSide(a, b fold.Event) bool {
	if a.Op != b.Op || a.Complete != b.Complete || !slices.Equal(a.Unavail, b.Unavail) || !slices.Equal(a.Absent, b.Absent) || !a.T.Equal(b.T) || !a.Raw.Equal(b.Raw) || !bytes.Equal(a.Hash, b.Hash) || (a.Row == nil) != (b.Row == nil) {
		return false
	}
	for i := range a.Row {
		if !fold.ValuesEqual(a.Row[i], b.Row[i]) {
			return false
		}
	}
	return true
}
