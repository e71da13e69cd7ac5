package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"
	"unsafe"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/pgcodec"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
)

// KeyPlan is one key's share of a batch.
type KeyPlan struct {
	ID     string // canonical key identity
	Key    []any  // typed key values, in key column order
	Events []fold.Event
	n      int // events planned for the key (plan's count, before events is filled)
}

// TablePlan is one table's share of a batch.
type TablePlan struct {
	Table     *Table
	Keys      map[string]*KeyPlan
	Order     []*KeyPlan
	Truncates []fold.Event
	// slab and ids are where keyPlan takes new keys' plans and copies
	// their identities: a chunk at a time, not one allocation per key.
	// Identities are strings over the copies, never written again; the
	// cache copies an identity it keeps.
	slab []KeyPlan
	ids  change.Boxes
}

func (p *TablePlan) keyPlan(key []any) *KeyPlan {
	var buf [128]byte
	id := appendKeyID(buf[:0], key)
	kp := p.Keys[string(id)]
	if kp == nil {
		kp = change.Take(&p.slab)
		*kp = KeyPlan{ID: p.intern(id), Key: key}
		p.Keys[kp.ID] = kp
		p.Order = append(p.Order, kp)
	}
	return kp
}

// intern returns b as a string over a copy in p.ids.
func (p *TablePlan) intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	c := p.ids.CopyBytes(b)
	return unsafe.String(&c[0], len(c))
}

// KeyID is change.KeyID of the keys' canon strings, built without them
// for the common key types (whose canon is change.Canon).
func KeyID(key []any) string {
	var out [128]byte
	return string(appendKeyID(out[:0], key))
}

// appendKeyID appends keyID(key) to b.
func appendKeyID(b []byte, key []any) []byte {
	var scratch [64]byte
	for i, v := range key {
		if i > 0 {
			b = append(b, 0)
		}
		switch v.(type) {
		case int64, int32, int16, string:
			b = change.AppendKeyPart(b, change.AppendCanon(scratch[:0], v))
		default:
			b = change.AppendKeyPart(b, []byte(fold.Canon(v)))
		}
	}
	return b
}

// Planner turns a batch's events into typed rows grouped by table and
// key: CPU only, no SQL. Its fields are scratch reused batch after batch,
// so it is used by one goroutine at a time (Prepare, under the Sink's registry lock).
type Planner struct {
	Conv Converter
	// has is the columns an image carries.
	has []bool
	// boxes holds the values plan decodes into the rows of a batch; they
	// die with the batch (the cache packs or detaches what it keeps).
	boxes change.Boxes
	// pending and owners are emptied after use.
	pending []fold.Event
	owners  []*KeyPlan
	// fill and fillPut: toFevent's.
	fill    rowFill
	fillPut func(name string, raw any) error
}

// NewPlanner returns a planner with its own converter.
func NewPlanner() Planner { return Planner{Conv: NewConverter()} }

// Plan converts a batch's events into typed rows grouped by table and key,
// for the tables the writers have loaded; spec gives a target's spec.
// Events that cannot be converted become dead letters. Truncates of tables
// that do not exist yet are returned apart: they are only recorded.
func (s *Planner) Plan(evs []*change.Event, afters []map[string]any, tables map[string]*Table, spec func(string) (catalog.TableSpec, bool)) (plans map[string]*TablePlan, dead []DeadLetter, early []EarlyTruncate, mismatches int) {
	plans = map[string]*TablePlan{}
	// The keys' events are gathered first and then laid out in one slice,
	// a key's events side by side: one allocation per batch, not per key.
	pending, owners := s.pending[:0], s.owners[:0]
	defer func() {
		clear(pending) // nothing of this batch kept alive by the scratch
		clear(owners)
		s.pending, s.owners = pending[:0], owners[:0]
	}()
	for i, ev := range evs {
		if afters[i] == nil && ev.AfterJSON != nil && ev.Op.HasAfter() && !ev.CanVisitAfter() {
			continue // undecodable: already a dead letter
		}
		t := tables[ev.Table]
		if spec, ok := spec(ev.Table); ok && t == nil && ev.Op == change.OpTruncate && len(ev.Seq) > 0 {
			early = append(early, EarlyTruncate{Name: spec.Target, Target: pgx.Identifier{spec.Schema, spec.Target}.Sanitize(), Seq: ev.Seq, At: ev.ValidFrom})
			continue
		}
		if t == nil {
			err := fmt.Errorf("no table is configured for %q", ev.Table)
			if _, ok := spec(ev.Table); ok {
				err = fmt.Errorf("table %s has no key columns yet: configure keys, or send keyed events first", ev.Table)
			}
			dead = append(dead, EventDeadLetter(ev, ReasonNoTable, err))
			continue
		}
		p := plans[ev.Table]
		if p == nil {
			p = &TablePlan{Table: t, Keys: map[string]*KeyPlan{}}
			plans[ev.Table] = p
		}
		fe, key, err := s.toFevent(t, ev, afters[i])
		if err != nil {
			reason := ReasonInvalid
			var tm errTypeMismatch
			if errors.As(err, &tm) {
				mismatches++
				reason = ReasonTypeMismatch
			}
			d := EventDeadLetter(ev, reason, err)
			d.KeyID = s.keyIDOf(t, ev)
			dead = append(dead, d)
			continue
		}
		if ev.Op == change.OpTruncate {
			p.Truncates = append(p.Truncates, fe)
			continue
		}
		kp := p.keyPlan(key)
		kp.n++
		pending, owners = append(pending, fe), append(owners, kp)
	}
	all := make([]fold.Event, len(pending))
	off := 0
	for _, p := range plans {
		for _, kp := range p.Order {
			kp.Events = all[off : off : off+kp.n] // capped: an append never reaches the next key's events
			off += kp.n
		}
	}
	for i, kp := range owners {
		kp.Events = append(kp.Events, pending[i])
	}
	for _, p := range plans {
		for _, kp := range p.Order {
			SortEvents(kp.Events)
		}
		SortEvents(p.Truncates)
	}
	return plans, dead, early, mismatches
}

// EarlyTruncate is a truncate of a table that does not exist yet: nothing to
// close, but later (late) events before it must still be closed by it.
type EarlyTruncate struct {
	Name   string // the target
	Target string
	Seq    change.Seq
	At     time.Time
}

// SortEvents sorts a key's events by sequence, stably (arrival order
// breaks ties).
func SortEvents(evs []fold.Event) {
	sorted := true // most often: a key's events arrived in order
	for i := 1; i < len(evs) && sorted; i++ {
		sorted = evs[i-1].Seq.Compare(evs[i].Seq) <= 0
	}
	if sorted {
		return
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Seq.Compare(evs[j].Seq) < 0 })
}

func (s *Planner) toFevent(t *Table, ev *change.Event, after map[string]any) (fold.Event, []any, error) {
	h := ev.Hash()
	fe := fold.Event{Seq: ev.Seq, Op: ev.Op, T: ev.ValidFrom, Hash: s.boxes.CopyBytes(h[:]), Src: ev, Complete: ev.Complete}
	if len(ev.Seq) == 0 {
		return fe, nil, fmt.Errorf("event has no sequence")
	}
	if ev.ValidFrom.IsZero() {
		return fe, nil, fmt.Errorf("event has no valid-from time")
	}
	switch ev.Op {
	case change.OpTruncate:
		return fe, nil, nil
	case change.OpCreate, change.OpRead, change.OpUpdate, change.OpDelete:
	default:
		return fe, nil, fmt.Errorf("unknown operation %q", ev.Op.String())
	}
	if len(ev.Key) != len(t.KeyIdx) {
		return fe, nil, fmt.Errorf("event has %d key values, table %s has %d key columns", len(ev.Key), t.Spec.Target, len(t.KeyIdx))
	}
	key := s.boxes.Anys(len(ev.Key))
	for i, ki := range t.KeyIdx {
		col := &t.Cols[ki]
		if ev.Key[i] == nil {
			return fe, nil, fmt.Errorf("key column %s is null", col.Name)
		}
		v, err := s.Conv.Convert(col, ev.Key[i])
		if err != nil {
			return fe, nil, fmt.Errorf("key column %s: %w", col.Name, err)
		}
		if _, ok := v.(Unavailable); ok {
			return fe, nil, fmt.Errorf("key column %s is unavailable", col.Name)
		}
		key[i] = v
	}
	if ev.Op.HasAfter() {
		visit := ev.CanVisitAfter()
		if after == nil && !visit {
			return fe, nil, fmt.Errorf("%s event has no after image", ev.Op.String())
		}
		row := s.boxes.Anys(len(t.Cols))
		if cap(s.has) < len(t.Cols) {
			s.has = make([]bool, len(t.Cols))
		}
		has := s.has[:len(t.Cols)] // scratch: Prepare holds the Sink's registry lock
		clear(has)
		f := &s.fill
		*f = rowFill{s: s, t: t, ev: ev, row: row, has: has, carried: len(t.KeyIdx)}
		defer func() { *f = rowFill{} }() // keeps no event alive
		if s.fillPut == nil {
			s.fillPut = f.put // one closure for every event
		}
		if visit {
			if err := ev.VisitAfter(&s.boxes, s.fillPut); err != nil {
				return fe, nil, err
			}
		} else {
			for name, raw := range after {
				if err := f.put(name, raw); err != nil {
					return fe, nil, err
				}
			}
		}
		carried := f.carried
		if carried < len(t.Cols) && !ev.Complete {
			fe.Absent = t.absentFrom(has)
		}
		for i, ki := range t.KeyIdx {
			row[ki] = key[i]
		}
		for i, v := range row {
			if _, ok := v.(Unavailable); ok {
				fe.Unavail = append(fe.Unavail, t.Cols[i].Name)
			}
		}
		fe.Row = row
		if ev.Op == change.OpCreate && len(ev.OldKey) == len(t.KeyIdx) && len(fe.Unavail) > 0 {
			fe.OldKey = make([]any, len(ev.OldKey))
			for i, ki := range t.KeyIdx {
				v, err := s.Conv.Convert(&t.Cols[ki], ev.OldKey[i])
				if err != nil || v == nil {
					return fe, nil, fmt.Errorf("old key column %s: %v", t.Cols[ki].Name, err)
				}
				fe.OldKey[i] = v
			}
		}
	}
	return fe, key, nil
}

// rowFill puts an image's values into a row of table t (toFevent's
// scratch).
type rowFill struct {
	s       *Planner
	t       *Table
	ev      *change.Event
	row     []any
	has     []bool
	carried int // the key's columns, and the other columns the image carries
}

func (f *rowFill) put(name string, raw any) error {
	t := f.t
	if t.Ignore[name] {
		// Ignored, but a column the table has is carried: NULL,
		// not absent (as the image's map had it).
		if i, ok := t.Index[name]; ok {
			f.has[i] = true
		} else if i, ok := t.Index[catalog.Ident(name)]; ok {
			f.has[i] = true
		}
		return nil
	}
	i, ok := t.Index[name]
	if !ok {
		i, ok = t.Index[catalog.Ident(name)]
	}
	if !ok {
		return fmt.Errorf("column %s is not in table %s", name, t.Spec.Target)
	}
	if f.has[i] {
		// Two of the image's names are one column: PostgreSQL keeps 63
		// bytes of a name, and MySQL (64) or SQL Server (128) names that
		// share them would write one column, the last silently winning.
		return fmt.Errorf("column %s and another column of the event are the same in PostgreSQL, which keeps the first 63 bytes of a name (%s): "+
			"list one of them in ignore_columns, or rename it at the source", name, t.Cols[i].Name)
	}
	var v any
	var err error
	if n, ok := raw.(json.Number); ok && pgcodec.IsText(t.Cols[i].OID) {
		v = f.s.boxes.String(string(n)) // convert's asText, boxed from the batch's slabs
	} else if v, err = f.s.Conv.Convert(&t.Cols[i], raw); err != nil {
		return typeMismatch(f.ev, &t.Cols[i], err)
	}
	f.row[i] = v
	if !t.Cols[i].Key && !f.has[i] {
		f.carried++
	}
	f.has[i] = true
	return nil
}

// absentFrom lists, in column order, the table's columns other than the key
// that the image after does not carry.
func (t *Table) absentFrom(has []bool) []string {
	var out []string
	for i, c := range t.Cols {
		if !has[i] && !c.Key {
			out = append(out, c.Name)
		}
	}
	return out
}

// errTypeMismatch marks a value that does not fit its column's type.
type errTypeMismatch struct{ error }

func (e errTypeMismatch) Unwrap() error { return e.error }

// typeMismatch explains a value that does not fit its column: when the
// event's schema declares another type than the table's, the source's
// type changed incompatibly.
func typeMismatch(ev *change.Event, col *catalog.ColumnInfo, err error) error {
	if ev.Row != nil {
		for _, c := range ev.Row.Columns() {
			if c.Name == col.Name && c.PGType != col.TypeName && c.PGType != col.FullType {
				return errTypeMismatch{fmt.Errorf("column %s: the source's type changed to %s, incompatible with the history table's %s: %w",
					col.Name, c.PGType, col.FullType, err)}
			}
		}
	}
	return errTypeMismatch{fmt.Errorf("column %s: %w", col.Name, err)}
}

// EventDeadLetter renders an event that failed after decoding. The original
// Kafka bytes are not kept in memory; the record's coordinates identify it.
func EventDeadLetter(ev *change.Event, reason string, err error) DeadLetter {
	key, _ := json.Marshal(ev.Key)
	var after any = ev.After
	if ev.After == nil && ev.AfterJSON == nil && ev.CanVisitAfter() { // typed values (Avro)
		after, _ = ev.DecodeAfter()
	}
	if ev.After == nil && ev.AfterJSON != nil {
		after = json.RawMessage(ev.AfterJSON)
		if !json.Valid(ev.AfterJSON) {
			after = string(ev.AfterJSON)
		}
	}
	val, _ := json.Marshal(map[string]any{
		"op": ev.Op.String(), "seq": ev.Seq.Parts(), "valid_from": ev.ValidFrom, "after": after,
	})
	return DeadLetter{Origin: ev.Origin, Table: ev.Table, Key: key, Value: val, Err: err.Error(), Decoded: true, Reason: reason}
}

// keyIDOf is the identity of an event's key in table t, when its values
// Convert to the key columns.
func (s *Planner) keyIDOf(t *Table, ev *change.Event) string {
	if len(ev.Key) != len(t.KeyIdx) {
		return ""
	}
	key := make([]any, len(ev.Key))
	for i, ki := range t.KeyIdx {
		v, err := s.Conv.Convert(&t.Cols[ki], ev.Key[i])
		if err != nil || v == nil {
			return ""
		}
		if _, ok := v.(Unavailable); ok {
			return ""
		}
		key[i] = v
	}
	return KeyID(key)
}

// NeedsOldKey reports whether a key's batch holds the create of a
// primary-key change that has unavailable-value placeholders.
func (kp *KeyPlan) NeedsOldKey() bool {
	for _, e := range kp.Events {
		if e.OldKey != nil {
			return true
		}
	}
	return false
}

// Partition is the partition kp's events come from (zero when unknown).
func (kp *KeyPlan) Partition() change.Partition {
	if len(kp.Events) == 0 || kp.Events[0].Src == nil {
		return change.Partition{}
	}
	return kp.Events[0].Src.Origin.Partition
}

// KeyColumns are t's key columns, in key order, copied (a batch being
// prepared may change t's columns meanwhile). Call it holding the Sink's registry lock.
func (t *Table) KeyColumns() []catalog.ColumnInfo {
	out := make([]catalog.ColumnInfo, len(t.KeyIdx))
	for i, ki := range t.KeyIdx {
		out[i] = t.Cols[ki]
	}
	return out
}

// WithPlaceholders returns a rebuilt event whose placeholder columns hold the
// placeholder again (on a copy of its row).
func (t *Table) WithPlaceholders(e fold.Event) fold.Event {
	if e.Row == nil {
		return e
	}
	e.Row = append([]any(nil), e.Row...)
	for _, name := range e.Unavail {
		if i, ok := t.Index[name]; ok {
			e.Row[i] = Unavailable{}
		}
	}
	return e
}

// SubPlan is a plan of the same table for some of the keys, with the
// plan's truncates when withTruncates.
func (p *TablePlan) SubPlan(keys []*KeyPlan, withTruncates bool) *TablePlan {
	sub := &TablePlan{Table: p.Table, Keys: map[string]*KeyPlan{}}
	for _, kp := range keys {
		sub.Keys[kp.ID] = kp
		sub.Order = append(sub.Order, kp)
	}
	if withTruncates {
		sub.Truncates = p.Truncates
	}
	return sub
}
