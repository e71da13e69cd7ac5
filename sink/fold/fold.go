package fold

import (
	"bytes"
	"slices"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Type1Scope says which versions of a key a Type 1 (untracked) change overwrites.
type Type1Scope string

// The Type 1 scopes of DESIGN.md section 3.
const (
	AllVersions    Type1Scope = "all_versions"
	CurrentVersion Type1Scope = "current_version"
)

// DeletesMode says what a delete does to the current version.
type DeletesMode string

// The delete modes of DESIGN.md section 3.
const (
	DeletesClose  DeletesMode = "close"
	DeletesIgnore DeletesMode = "ignore"
	// DeletesNewRecord closes the live version and opens a version marked
	// deleted (scd_deleted) with its values, until the key is re-created.
	DeletesNewRecord DeletesMode = "new_record"
)

// Event is an event as the fold sees it: typed row, and its time: T is
// the raw valid-from of a new event and the clamped time of one the fold
// produced or rebuilt from the table; Raw is the raw valid-from of the
// latter where clamping raised it (zero where it did not, or where the
// table predates scd_raw_t). The fold starts from Raw where it is set.
type Event struct {
	Seq  change.Seq
	T    time.Time
	Raw  time.Time
	Row  []any // typed after image; nil for deletes and truncates
	Hash []byte
	// Unavail names the columns that held Debezium's unavailable-value
	// placeholder; a rebuilt event gets the placeholder back, so a re-fold
	// resolves it against the right previous image.
	Unavail []string
	// Absent names the columns the event did not carry (dropped at the
	// source, or not added yet): stored NULL, never compared.
	Absent []string
	Src    *change.Event // nil when rebuilt from the table
	// OldKey: a create of a primary-key change, whose placeholders take
	// the old key's values (typed, in key column order).
	OldKey []any
	Op     change.Op
	// Resolved marks the first event of a partial history: it folds at
	// its clamped time t, as the events before it (not read) gave it.
	Resolved bool
	// Complete: the image is the whole row (change.Event.Complete): a
	// column added to the table later is null in it, not unknown; written
	// with scd_attnum NULL, which says so.
	Complete bool
}

// Version is one row of a history table.
type Version struct {
	Key      []any // typed key values
	ID       int64 // scd_id when read from the table, else 0
	Seq      change.Seq
	Hash     []byte
	From     time.Time
	Raw      time.Time // the opening event's own time, when clamping raised it to from
	To       time.Time
	CloseSeq change.Seq
	Row      []any
	Opener   []any // the opening event's own image, before Type 1 overwrites
	Unavail  []string
	// Absent names the columns whose value the version does not know
	// (stored as scd_absent): its opening event did not carry them and,
	// for tracked ones, no later event of the version has. OpenAbsent is the opening
	// event's own list: when the two differ the opener is kept in the
	// side table, as its image is no longer the version's row.
	Absent     []string
	OpenAbsent []string
	// The one-byte fields together, without padding between them: a
	// batch folds a few versions per event.
	Op       change.Op
	Stored   bool // the version is in the table (read or cached)
	Closed   bool
	Complete bool // opened by a complete image (Event.Complete)
}

// Event returns the event that opened v, rebuilt from the table, with row
// as its image and absent as the columns it lacked.
func (v *Version) Event(row []any, absent []string) Event {
	return Event{Seq: v.Seq, Op: v.Op, T: v.From, Raw: v.Raw, Row: row, Hash: v.Hash, Unavail: v.Unavail, Absent: absent, Complete: v.Complete}
}

// Clone returns a copy of v with its own row, from m.
func (v *Version) Clone(m *Mem) *Version {
	c := m.Version()
	*c = *v
	c.Row = m.Row(v.Row)
	return c
}

// SameAs reports whether v and o are the same row of the history table
// (scd_id and the key aside: those are the same key's).
func (v *Version) SameAs(o *Version) bool {
	if v.Op != o.Op || !bytes.Equal(v.Hash, o.Hash) || !slices.Equal(v.Unavail, o.Unavail) || !slices.Equal(v.Absent, o.Absent) || v.Complete != o.Complete || !v.From.Equal(o.From) || !v.Raw.Equal(o.Raw) || v.Closed != o.Closed ||
		!bytes.Equal(v.CloseSeq, o.CloseSeq) || len(v.Row) != len(o.Row) {
		return false
	}
	if v.Closed && !v.To.Equal(o.To) {
		return false
	}
	for i := range v.Row {
		if !ValuesEqual(v.Row[i], o.Row[i]) {
			return false
		}
	}
	return true
}

// State is a key's state between events: the live version, the time of
// the key's last event and the last after image (for placeholders).
type State struct {
	Live    *Version
	PrevT   time.Time
	HasPrev bool
	PrevRow []any
	// Mem gives the fold its versions and their rows (nil: the heap).
	Mem *Mem
}

// Out is what folding a key's events produced.
type Out struct {
	Versions []*Version // versions created or changed, in sequence order
	Side     []Event    // events that opened no version, with clamped times
	Opened   int
	Closed   int
}

// Shape is what the fold needs to know of a history table: its source
// columns' names and positions in a row, which of them are tracked (Type 2)
// and which are Type 1, and the table's delete and Type 1 modes. The key
// columns are in neither list. A sink's table description embeds it and
// rebuilds it whenever it reads the table's columns again.
type Shape struct {
	Names      []string       // the source columns, in row order
	Index      map[string]int // a column's position by name
	Tracked    []int          // positions of the tracked columns
	Type1      []int          // positions of the Type 1 columns
	Deletes    DeletesMode
	Type1Scope Type1Scope
}

// Fold applies evs (sorted by sequence) to st, exactly as DESIGN.md section 5
// defines, and returns the versions it touched. Type 1 propagation to all
// versions (type1_scope all_versions) is left to the caller, which knows
// which versions exist.
func (t *Shape) Fold(st *State, evs []Event) Out {
	var out Out
	out.Versions = st.Mem.VersionList() // out.side takes its room at its first row
	if st.Live != nil {
		out.Versions = append(out.Versions, st.Live) // touched: its Type 1 values may change
	}
	closeLive := func(at time.Time, seq change.Seq) {
		st.Live.To, st.Live.Closed, st.Live.CloseSeq = at, true, seq
		st.Live = nil
		out.Closed++
	}
	for _, e := range evs {
		in := e.T
		if !e.Raw.IsZero() && !e.Resolved {
			in = e.Raw
		}
		at := in
		if st.HasPrev && st.PrevT.After(at) {
			at = st.PrevT
		}
		raw := e.Raw // kept where clamping changed it: a later re-fold may not clamp
		if !e.Resolved {
			raw = time.Time{}
			if !in.Equal(at) {
				raw = in
			}
		}
		if e.Op == change.OpTruncate {
			// A truncate is no event of the key: it closes what is live and
			// only then moves the key's time on.
			if st.Live != nil {
				closeLive(at, e.Seq)
				st.PrevT, st.HasPrev = at, true
			}
			continue
		}
		st.PrevT, st.HasPrev = at, true
		switch {
		case e.Op.HasAfter():
			row := resolvePlaceholders(e.Row, st.PrevRow)
			st.PrevRow = row
			if st.Live != nil && (st.Live.Deleted() || e.Op == change.OpCreate || !t.trackedEqual(row, e.Absent, st.Live)) {
				closeLive(at, e.Seq)
			}
			if st.Live == nil {
				v := st.Mem.Version()
				*v = Version{Seq: e.Seq, Op: e.Op, Hash: e.Hash, From: at, Raw: raw, Row: st.Mem.Row(row), Opener: row, Unavail: e.Unavail, Absent: e.Absent, OpenAbsent: e.Absent, Complete: e.Complete}
				st.Live = v
				out.Versions = append(out.Versions, v) // new: not touched before
				out.Opened++
				continue
			}
			for _, i := range t.Type1 {
				st.Live.Row[i] = row[i]
			}
			if len(st.Live.Absent) > 0 {
				t.learn(st.Live, row, e.Absent)
			}
			if out.Side == nil {
				out.Side = st.Mem.SideList()
			}
			out.Side = append(out.Side, Event{Seq: e.Seq, Op: e.Op, T: at, Raw: raw, Row: row, Hash: e.Hash, Unavail: e.Unavail, Absent: e.Absent, Complete: e.Complete, Src: e.Src})
		case e.Op == change.OpDelete:
			switch {
			case e.Resolved && e.Row != nil && st.Live == nil:
				// A partial history starting at a version marked deleted
				// (deletes: new_record): it is the state the fold starts in.
				// Only retention leaves one to start from (a repair starts
				// at the version before it otherwise), with the events
				// before it gone: its row, the closed version's values, is
				// what is left of the last image, as for the append path
				// (Latest.PrevImage), so placeholders after it agree.
				st.Live = t.openDeleted(st, e, e.Row, e.Absent, e.Complete, at, raw)
				st.PrevRow = e.Row
				out.Versions = append(out.Versions, st.Live)
				continue
			case t.Deletes == DeletesNewRecord && st.Live != nil && !st.Live.Deleted():
				closed := st.Live
				closeLive(at, e.Seq)
				st.Live = t.openDeleted(st, e, closed.Row, closed.Absent, closed.Complete, at, raw)
				out.Versions = append(out.Versions, st.Live)
				out.Opened++
				continue
			case t.Deletes == DeletesClose && st.Live != nil && !st.Live.Deleted():
				closeLive(at, e.Seq)
			}
			if out.Side == nil {
				out.Side = st.Mem.SideList()
			}
			out.Side = append(out.Side, Event{Seq: e.Seq, Op: e.Op, T: at, Raw: raw, Hash: e.Hash, Src: e.Src})
		}
	}
	return out
}

// openDeleted returns the version a delete e opens under deletes:
// new_record: marked deleted (its scd_op is the delete's), with row (the
// closed version's values) as its image, from the delete's time at. Its
// opening event is the delete: a re-fold rebuilds it from the version.
func (t *Shape) openDeleted(st *State, e Event, row []any, absent []string, complete bool, at, raw time.Time) *Version {
	v := st.Mem.Version()
	r := st.Mem.Row(row)
	*v = Version{Seq: e.Seq, Op: change.OpDelete, Hash: e.Hash, From: at, Raw: raw, Row: r, Opener: r, Absent: absent, OpenAbsent: absent, Complete: complete}
	return v
}

// Deleted reports whether v is a version marked deleted (deletes:
// new_record): the only versions a delete opens.
func (v *Version) Deleted() bool { return v.Op == change.OpDelete }

// trackedEqual reports whether row, an event's image lacking the columns
// absent, equals the live version's over the tracked columns both carry
// (DESIGN.md section 11: a column dropped or added at the source opens no
// version by itself; the next real change does).
func (t *Shape) trackedEqual(row []any, absent []string, live *Version) bool {
	if len(absent) == 0 && len(live.Absent) == 0 {
		return RowsEqual(row, live.Row, t.Tracked)
	}
	for _, i := range t.Tracked {
		n := t.Names[i]
		if slices.Contains(absent, n) || slices.Contains(live.Absent, n) {
			continue
		}
		if !ValuesEqual(row[i], live.Row[i]) {
			return false
		}
	}
	return true
}

// learn gives the live version the values of the tracked columns it does
// not know that row (lacking absent) carries: a column added at the source
// shows in the current version from the first event that carries it, and
// the next change of it opens a version.
func (t *Shape) learn(live *Version, row []any, absent []string) {
	var left []string
	for _, n := range live.Absent {
		i, ok := t.Index[n]
		if !ok || !slices.Contains(t.Tracked, i) || slices.Contains(absent, n) {
			left = append(left, n)
			continue
		}
		live.Row[i] = row[i]
	}
	if len(left) != len(live.Absent) {
		live.Absent = left
	}
}

// OpenerDiffers reports whether v's row is no longer its opening event's
// image as a re-fold needs it (Type 1 values overwritten under
// current_version, or columns learned): the opener is then kept in the
// side table.
func (t *Shape) OpenerDiffers(v *Version) bool {
	return (t.Type1Scope == CurrentVersion && !RowsEqual(v.Row, v.Opener, t.Type1)) || len(v.Absent) != len(v.OpenAbsent)
}

// resolvePlaceholders returns row with Debezium's unavailable-value
// placeholders replaced by the previous image's values (NULL when there is
// none). It copies row rather than change it, so a retried batch sees the
// placeholders again.
func resolvePlaceholders(row, prev []any) []any {
	copied := false
	for i, v := range row {
		if _, ok := v.(change.UnavailableValue); ok {
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

// SpreadType1 gives every version the Type 1 values of row (all_versions).
func (t *Shape) SpreadType1(vs []*Version, row []any) {
	if row == nil {
		return
	}
	for _, v := range vs {
		for _, i := range t.Type1 {
			v.Row[i] = row[i]
		}
	}
}
