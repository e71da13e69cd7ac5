package statecache

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
)

// A cached key's state is kept packed: one byte slice the collector marks
// but never scans, instead of a version, a row of boxed values and the
// slices around them (some thirty objects per key). With the default
// cache of tens of thousands of keys those objects were most of what the
// collector traced on every cycle (docs/benchmarks.md). A hit unpacks a
// fresh latest. A state holding a value of a type with no packed form
// (arrays, timetz, inet, times in a named zone, ...) is kept as a detached
// copy (detach): its values, boxed from the batch's slabs, must not keep
// those slabs, and the events whose values share them, alive.
//
// The packed form is exact: unpack(pack(l)) holds the same Go types and
// values, nil and empty slices told apart (TestPackLatestRoundTrip).
// Strings and byte slices of an unpacked state share the blob, which is
// never written after pack: byte slices are capped at their length, so an
// append copies them.

// pack appends l's packed form to b, or reports false when a value
// has no packed form.
func pack(b []byte, l *fold.Latest) ([]byte, bool) {
	var flags byte
	if l.OpenerSaved {
		flags |= 1
	}
	if l.V != nil {
		flags |= 2
	}
	if l.SideMaxT != nil {
		flags |= 4
	}
	if l.PrevKnown {
		flags |= 8
	}
	if !l.ClosedFrom.IsZero() {
		flags |= 16
	}
	b = append(b, flags)
	b = change.AppendOptBytes(b, l.SideMaxSeq)
	b = change.AppendStrings(b, l.PrevAbsent)
	var ok bool
	if l.SideMaxT != nil {
		if b, ok = change.AppendTime(b, *l.SideMaxT); !ok {
			return nil, false
		}
	}
	if !l.ClosedFrom.IsZero() {
		if b, ok = change.AppendTime(b, l.ClosedFrom); !ok {
			return nil, false
		}
	}
	v := l.V
	if v == nil {
		return b, true
	}
	if v.Opener != nil {
		return nil, false // cached versions take their opener from the row
	}
	var vf byte
	if v.Stored {
		vf |= 1
	}
	if v.Closed {
		vf |= 2
	}
	if v.Complete {
		vf |= 16
	}
	switch {
	case v.OpenAbsent == nil:
	case v.Absent != nil && len(v.OpenAbsent) == len(v.Absent) && (len(v.Absent) == 0 || &v.OpenAbsent[0] == &v.Absent[0]):
		vf |= 4 // the same slice as absent
	default:
		vf |= 8
	}
	b = append(b, vf, byte(v.Op))
	b = binary.AppendVarint(b, v.ID)
	b = change.AppendOptBytes(b, v.Seq)
	b = change.AppendOptBytes(b, v.Hash)
	b = change.AppendOptBytes(b, v.CloseSeq)
	for _, t := range []time.Time{v.From, v.Raw, v.To} {
		if b, ok = change.AppendTime(b, t); !ok {
			return nil, false
		}
	}
	if b, ok = change.AppendValues(b, v.Key); !ok {
		return nil, false
	}
	if b, ok = change.AppendValues(b, v.Row); !ok {
		return nil, false
	}
	b = change.AppendStrings(b, v.Unavail)
	b = change.AppendStrings(b, v.Absent)
	if vf&8 != 0 {
		b = change.AppendStrings(b, v.OpenAbsent)
	}
	return b, true
}

// unpack decodes what pack encoded, boxing values from boxes
// and taking the structs from mem.
func unpack(blob []byte, boxes *change.Boxes, mem *fold.Mem) (*fold.Latest, error) {
	u := change.NewUnpacker(blob, boxes)
	flags := u.Byte()
	l := mem.Latest()
	l.OpenerSaved = flags&1 != 0
	l.SideMaxSeq = change.Seq(u.OptBytes())
	l.PrevKnown = flags&8 != 0
	l.PrevAbsent = u.Strings()
	if flags&4 != 0 {
		l.SetSideMaxT(u.Time())
	}
	if flags&16 != 0 {
		l.ClosedFrom = u.Time()
	}
	if flags&2 != 0 {
		vf := u.Byte()
		v := mem.Version()
		v.Stored, v.Closed, v.Complete, v.Op = vf&1 != 0, vf&2 != 0, vf&16 != 0, change.Op(u.Byte())
		v.ID = u.Varint()
		v.Seq = change.Seq(u.OptBytes())
		v.Hash = u.OptBytes()
		v.CloseSeq = change.Seq(u.OptBytes())
		v.From, v.Raw, v.To = u.Time(), u.Time(), u.Time()
		v.Key = u.Values()
		v.Row = u.Values()
		v.Unavail = u.Strings()
		v.Absent = u.Strings()
		switch {
		case vf&4 != 0:
			v.OpenAbsent = v.Absent
		case vf&8 != 0:
			v.OpenAbsent = u.Strings()
		}
		l.V = v
	}
	if err := u.Done(); err != nil {
		return nil, err
	}
	return l, nil
}

// detach returns a copy of l that shares no memory with the batch it came
// from: its slices are its own, its strings and byte slices copied (the
// batch's strings share the raw messages), and the values Boxes gave it
// boxed again the ordinary way. Other values were never boxed from slabs.
func detach(l *fold.Latest) *fold.Latest {
	c := *l
	c.SideMaxSeq = change.Seq(bytes.Clone(l.SideMaxSeq))
	c.PrevAbsent = slices.Clone(l.PrevAbsent)
	if l.SideMaxT != nil {
		t := *l.SideMaxT
		c.SideMaxT = &t
	}
	if v := l.V; v != nil {
		w := *v
		w.Key, w.Row, w.Opener = detachValues(v.Key), detachValues(v.Row), detachValues(v.Opener)
		w.Seq, w.CloseSeq, w.Hash = change.Seq(bytes.Clone(v.Seq)), change.Seq(bytes.Clone(v.CloseSeq)), bytes.Clone(v.Hash)
		c.V = &w
	}
	return &c
}

func detachValues(vs []any) []any {
	if vs == nil {
		return nil
	}
	out := make([]any, len(vs))
	for i, v := range vs {
		switch x := v.(type) {
		case string:
			out[i] = strings.Clone(x)
		case int64:
			out[i] = x
		case int32:
			out[i] = x
		case time.Time:
			out[i] = x
		case []byte:
			out[i] = bytes.Clone(x)
		case json.RawMessage:
			out[i] = json.RawMessage(bytes.Clone(x))
		case pgtype.Numeric:
			if x.Int != nil {
				x.Int = new(big.Int).Set(x.Int)
			}
			out[i] = x
		case []any:
			out[i] = detachValues(x)
		default:
			out[i] = v
		}
	}
	return out
}
