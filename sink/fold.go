package sink

import (
	"bytes"
	"slices"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// fevent is an event as the fold sees it: typed row, and a time that is the
// raw valid-from for a new event or the clamped time for one rebuilt from
// the table (see the package comment for why both fold alike).
type fevent struct {
	seq  change.Seq
	op   change.Op
	t    time.Time
	row  []any // typed after image; nil for deletes and truncates
	hash []byte
	// unavail names the columns that held Debezium's unavailable-value
	// placeholder; a rebuilt event gets the placeholder back, so a re-fold
	// resolves it against the right previous image.
	unavail []string
	src     *change.Event // nil when rebuilt from the table
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
	to       time.Time
	closed   bool
	closeSeq change.Seq
	row      []any
	opener   []any // the opening event's own image, before Type 1 overwrites
	unavail  []string
}

func (v *version) clone() *version {
	c := *v
	c.row = append([]any(nil), v.row...)
	return &c
}

func (v *version) sameAs(o *version) bool {
	if v.op != o.op || !bytes.Equal(v.hash, o.hash) || !slices.Equal(v.unavail, o.unavail) || !v.from.Equal(o.from) || v.closed != o.closed ||
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
	touched := map[*version]bool{}
	touch := func(v *version) {
		if !touched[v] {
			touched[v] = true
			out.versions = append(out.versions, v)
		}
	}
	if st.live != nil {
		touch(st.live)
	}
	closeLive := func(at time.Time, seq change.Seq) {
		st.live.to, st.live.closed, st.live.closeSeq = at, true, seq
		st.live = nil
		out.closed++
	}
	for _, e := range evs {
		at := e.t
		if st.hasPrev && st.prevT.After(at) {
			at = st.prevT
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
			if st.live != nil && (e.op == change.OpCreate || !rowsEqual(row, st.live.row, t.trkIdx)) {
				closeLive(at, e.seq)
			}
			if st.live == nil {
				v := &version{seq: e.seq, op: e.op, hash: e.hash, from: at, row: append([]any(nil), row...), opener: row, unavail: e.unavail}
				st.live = v
				touch(v)
				out.opened++
				continue
			}
			for _, i := range t.t1Idx {
				st.live.row[i] = row[i]
			}
			out.side = append(out.side, fevent{seq: e.seq, op: e.op, t: at, row: row, hash: e.hash, unavail: e.unavail, src: e.src})
		case e.op == change.OpDelete:
			if t.spec.Deletes == DeletesClose && st.live != nil {
				closeLive(at, e.seq)
			}
			out.side = append(out.side, fevent{seq: e.seq, op: e.op, t: at, hash: e.hash, src: e.src})
		}
	}
	return out
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
