package sink

import (
	"bytes"
	"slices"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// fevent is an event as the fold sees it: typed row, and its time: t is
// the raw valid-from of a new event and the clamped time of one the fold
// produced or rebuilt from the table; raw is the raw valid-from of the
// latter where clamping raised it (zero where it did not, or where the
// table predates scd_raw_t). The fold starts from raw where it is set.
type fevent struct {
	seq change.Seq
	op  change.Op
	t   time.Time
	raw time.Time
	// resolved marks the first event of a partial history: it folds at
	// its clamped time t, as the events before it (not read) gave it.
	resolved bool
	row      []any // typed after image; nil for deletes and truncates
	hash     []byte
	// unavail names the columns that held Debezium's unavailable-value
	// placeholder; a rebuilt event gets the placeholder back, so a re-fold
	// resolves it against the right previous image.
	unavail []string
	// absent names the columns the event did not carry (dropped at the
	// source, or not added yet): stored NULL, never compared.
	absent []string
	// complete: the image is the whole row (change.Event.Complete): a
	// column added to the table later is null in it, not unknown; written
	// with scd_attnum NULL, which says so.
	complete bool
	src      *change.Event // nil when rebuilt from the table
	// oldKey: a create of a primary-key change, whose placeholders take
	// the old key's values (typed, in key column order).
	oldKey []any
}

// version is one row of a history table.
type version struct {
	key      []any // typed key values
	id       int64 // scd_id when read from the table, else 0
	stored   bool  // the version is in the table (read or cached)
	seq      change.Seq
	op       change.Op
	hash     []byte
	from     time.Time
	raw      time.Time // the opening event's own time, when clamping raised it to from
	to       time.Time
	closed   bool
	closeSeq change.Seq
	row      []any
	opener   []any // the opening event's own image, before Type 1 overwrites
	unavail  []string
	// absent names the columns whose value the version does not know
	// (stored as scd_absent): its opening event did not carry them and,
	// for tracked ones, no later event of the version has. openAbsent is the opening
	// event's own list: when the two differ the opener is kept in the
	// side table, as its image is no longer the version's row.
	absent     []string
	openAbsent []string
	complete   bool // opened by a complete image (fevent.complete)
}

// event returns the event that opened v, rebuilt from the table, with row
// as its image and absent as the columns it lacked.
func (v *version) event(row []any, absent []string) fevent {
	return fevent{seq: v.seq, op: v.op, t: v.from, raw: v.raw, row: row, hash: v.hash, unavail: v.unavail, absent: absent, complete: v.complete}
}

// clone returns a copy of v with its own row, from w's slabs.
func (v *version) clone(w *writes) *version {
	c := w.slabs().version()
	*c = *v
	c.row = w.row(v.row)
	return c
}

func (v *version) sameAs(o *version) bool {
	if v.op != o.op || !bytes.Equal(v.hash, o.hash) || !slices.Equal(v.unavail, o.unavail) || !slices.Equal(v.absent, o.absent) || v.complete != o.complete || !v.from.Equal(o.from) || !v.raw.Equal(o.raw) || v.closed != o.closed ||
		!bytes.Equal(v.closeSeq, o.closeSeq) || len(v.row) != len(o.row) {
		return false
	}
	if v.closed && !v.to.Equal(o.to) {
		return false
	}
	for i := range v.row {
		if !valuesEqual(v.row[i], o.row[i]) {
			return false
		}
	}
	return true
}

// foldState is a key's state between events: the live version, the time of
// the key's last event and the last after image (for placeholders).
type foldState struct {
	live    *version
	prevT   time.Time
	hasPrev bool
	prevRow []any
	// w gives the fold its versions and their rows (nil: the heap).
	w *writes
}

// foldOut is what folding a key's events produced.
type foldOut struct {
	versions []*version // versions created or changed, in sequence order
	side     []fevent   // events that opened no version, with clamped times
	opened   int
	closed   int
}

// fold applies evs (sorted by sequence) to st, exactly as DESIGN.md section 5
// defines, and returns the versions it touched. Type 1 propagation to all
// versions (type1_scope all_versions) is left to the caller, which knows
// which versions exist.
func (t *table) fold(st *foldState, evs []fevent) foldOut {
	var out foldOut
	out.versions = st.w.slabs().versionList() // out.side takes its room at its first row
	if st.live != nil {
		out.versions = append(out.versions, st.live) // touched: its Type 1 values may change
	}
	closeLive := func(at time.Time, seq change.Seq) {
		st.live.to, st.live.closed, st.live.closeSeq = at, true, seq
		st.live = nil
		out.closed++
	}
	for _, e := range evs {
		in := e.t
		if !e.raw.IsZero() && !e.resolved {
			in = e.raw
		}
		at := in
		if st.hasPrev && st.prevT.After(at) {
			at = st.prevT
		}
		raw := e.raw // kept where clamping changed it: a later re-fold may not clamp
		if !e.resolved {
			raw = time.Time{}
			if !in.Equal(at) {
				raw = in
			}
		}
		if e.op == change.OpTruncate {
			// A truncate is no event of the key: it closes what is live and
			// only then moves the key's time on.
			if st.live != nil {
				closeLive(at, e.seq)
				st.prevT, st.hasPrev = at, true
			}
			continue
		}
		st.prevT, st.hasPrev = at, true
		switch {
		case e.op.HasAfter():
			row := resolvePlaceholders(e.row, st.prevRow)
			st.prevRow = row
			if st.live != nil && (st.live.deleted() || e.op == change.OpCreate || !t.trackedEqual(row, e.absent, st.live)) {
				closeLive(at, e.seq)
			}
			if st.live == nil {
				v := st.w.slabs().version()
				*v = version{seq: e.seq, op: e.op, hash: e.hash, from: at, raw: raw, row: st.w.row(row), opener: row, unavail: e.unavail, absent: e.absent, openAbsent: e.absent, complete: e.complete}
				st.live = v
				out.versions = append(out.versions, v) // new: not touched before
				out.opened++
				continue
			}
			for _, i := range t.t1Idx {
				st.live.row[i] = row[i]
			}
			if len(st.live.absent) > 0 {
				t.learn(st.live, row, e.absent)
			}
			if out.side == nil {
				out.side = st.w.slabs().sideList()
			}
			out.side = append(out.side, fevent{seq: e.seq, op: e.op, t: at, raw: raw, row: row, hash: e.hash, unavail: e.unavail, absent: e.absent, complete: e.complete, src: e.src})
		case e.op == change.OpDelete:
			switch {
			case e.resolved && e.row != nil && st.live == nil:
				// A partial history starting at a version marked deleted
				// (deletes: new_record): it is the state the fold starts in.
				st.live = t.openDeleted(st, e, e.row, e.absent, e.complete, at, raw)
				out.versions = append(out.versions, st.live)
				continue
			case t.spec.Deletes == DeletesNewRecord && st.live != nil && !st.live.deleted():
				closed := st.live
				closeLive(at, e.seq)
				st.live = t.openDeleted(st, e, closed.row, closed.absent, closed.complete, at, raw)
				out.versions = append(out.versions, st.live)
				out.opened++
				continue
			case t.spec.Deletes == DeletesClose && st.live != nil && !st.live.deleted():
				closeLive(at, e.seq)
			}
			if out.side == nil {
				out.side = st.w.slabs().sideList()
			}
			out.side = append(out.side, fevent{seq: e.seq, op: e.op, t: at, raw: raw, hash: e.hash, src: e.src})
		}
	}
	return out
}

// openDeleted returns the version a delete e opens under deletes:
// new_record: marked deleted (its scd_op is the delete's), with row (the
// closed version's values) as its image, from the delete's time at. Its
// opening event is the delete: a re-fold rebuilds it from the version.
func (t *table) openDeleted(st *foldState, e fevent, row []any, absent []string, complete bool, at, raw time.Time) *version {
	v := st.w.slabs().version()
	r := st.w.row(row)
	*v = version{seq: e.seq, op: change.OpDelete, hash: e.hash, from: at, raw: raw, row: r, opener: r, absent: absent, openAbsent: absent, complete: complete}
	return v
}

// deleted reports whether v is a version marked deleted (deletes:
// new_record): the only versions a delete opens.
func (v *version) deleted() bool { return v.op == change.OpDelete }

// trackedEqual reports whether row, an event's image lacking the columns
// absent, equals the live version's over the tracked columns both carry
// (DESIGN.md section 11: a column dropped or added at the source opens no
// version by itself; the next real change does).
func (t *table) trackedEqual(row []any, absent []string, live *version) bool {
	if len(absent) == 0 && len(live.absent) == 0 {
		return rowsEqual(row, live.row, t.trkIdx)
	}
	for _, i := range t.trkIdx {
		n := t.cols[i].name
		if slices.Contains(absent, n) || slices.Contains(live.absent, n) {
			continue
		}
		if !valuesEqual(row[i], live.row[i]) {
			return false
		}
	}
	return true
}

// learn gives the live version the values of the tracked columns it does
// not know that row (lacking absent) carries: a column added at the source
// shows in the current version from the first event that carries it, and
// the next change of it opens a version.
func (t *table) learn(live *version, row []any, absent []string) {
	var left []string
	for _, n := range live.absent {
		i, ok := t.colIdx[n]
		if !ok || !t.cols[i].tracked || slices.Contains(absent, n) {
			left = append(left, n)
			continue
		}
		live.row[i] = row[i]
	}
	if len(left) != len(live.absent) {
		live.absent = left
	}
}

// openerDiffers reports whether v's row is no longer its opening event's
// image as a re-fold needs it (Type 1 values overwritten under
// current_version, or columns learned): the opener is then kept in the
// side table.
func (t *table) openerDiffers(v *version) bool {
	return (t.spec.Type1Scope == CurrentVersion && !rowsEqual(v.row, v.opener, t.t1Idx)) || len(v.absent) != len(v.openAbsent)
}

// resolvePlaceholders returns row with Debezium's unavailable-value
// placeholders replaced by the previous image's values (NULL when there is
// none). It copies row rather than change it, so a retried batch sees the
// placeholders again.
func resolvePlaceholders(row, prev []any) []any {
	copied := false
	for i, v := range row {
		if _, ok := v.(unavailable); ok {
			if !copied {
				row, copied = append([]any(nil), row...), true
			}
			if prev != nil {
				row[i] = prev[i]
			} else {
				row[i] = nil
			}
		}
	}
	return row
}

// spreadType1 gives every version the Type 1 values of row (all_versions).
func (t *table) spreadType1(vs []*version, row []any) {
	if row == nil {
		return
	}
	for _, v := range vs {
		for _, i := range t.t1Idx {
			v.row[i] = row[i]
		}
	}
}
