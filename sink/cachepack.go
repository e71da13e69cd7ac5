package sink

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/big"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
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

// packLatest appends l's packed form to b, or reports false when a value
// has no packed form.
func packLatest(b []byte, l *latest) ([]byte, bool) {
	var flags byte
	if l.openerSaved {
		flags |= 1
	}
	if l.v != nil {
		flags |= 2
	}
	if l.sideMaxT != nil {
		flags |= 4
	}
	b = append(b, flags)
	b = change.AppendOptBytes(b, l.sideMaxSeq)
	var ok bool
	if l.sideMaxT != nil {
		if b, ok = change.AppendTime(b, *l.sideMaxT); !ok {
			return nil, false
		}
	}
	v := l.v
	if v == nil {
		return b, true
	}
	if v.opener != nil {
		return nil, false // cached versions take their opener from the row
	}
	var vf byte
	if v.stored {
		vf |= 1
	}
	if v.closed {
		vf |= 2
	}
	if v.complete {
		vf |= 16
	}
	switch {
	case v.openAbsent == nil:
	case v.absent != nil && len(v.openAbsent) == len(v.absent) && (len(v.absent) == 0 || &v.openAbsent[0] == &v.absent[0]):
		vf |= 4 // the same slice as absent
	default:
		vf |= 8
	}
	b = append(b, vf, byte(v.op))
	b = binary.AppendVarint(b, v.id)
	b = change.AppendOptBytes(b, v.seq)
	b = change.AppendOptBytes(b, v.hash)
	b = change.AppendOptBytes(b, v.closeSeq)
	for _, t := range []time.Time{v.from, v.raw, v.to} {
		if b, ok = change.AppendTime(b, t); !ok {
			return nil, false
		}
	}
	if b, ok = change.AppendValues(b, v.key); !ok {
		return nil, false
	}
	if b, ok = change.AppendValues(b, v.row); !ok {
		return nil, false
	}
	b = change.AppendStrings(b, v.unavail)
	b = change.AppendStrings(b, v.absent)
	if vf&8 != 0 {
		b = change.AppendStrings(b, v.openAbsent)
	}
	return b, true
}

// unpackLatest decodes what packLatest encoded, boxing values from boxes
// and taking the structs from mem.
func unpackLatest(blob []byte, boxes *change.Boxes, mem *slabs) (*latest, error) {
	u := change.NewUnpacker(blob, boxes)
	flags := u.Byte()
	l := mem.latest()
	l.openerSaved = flags&1 != 0
	l.sideMaxSeq = change.Seq(u.OptBytes())
	if flags&4 != 0 {
		l.setSideMaxT(u.Time())
	}
	if flags&2 != 0 {
		vf := u.Byte()
		v := mem.version()
		v.stored, v.closed, v.complete, v.op = vf&1 != 0, vf&2 != 0, vf&16 != 0, change.Op(u.Byte())
		v.id = u.Varint()
		v.seq = change.Seq(u.OptBytes())
		v.hash = u.OptBytes()
		v.closeSeq = change.Seq(u.OptBytes())
		v.from, v.raw, v.to = u.Time(), u.Time(), u.Time()
		v.key = u.Values()
		v.row = u.Values()
		v.unavail = u.Strings()
		v.absent = u.Strings()
		switch {
		case vf&4 != 0:
			v.openAbsent = v.absent
		case vf&8 != 0:
			v.openAbsent = u.Strings()
		}
		l.v = v
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
func detach(l *latest) *latest {
	c := *l
	c.sideMaxSeq = change.Seq(bytes.Clone(l.sideMaxSeq))
	if l.sideMaxT != nil {
		t := *l.sideMaxT
		c.sideMaxT = &t
	}
	if v := l.v; v != nil {
		w := *v
		w.key, w.row, w.opener = detachValues(v.key), detachValues(v.row), detachValues(v.opener)
		w.seq, w.closeSeq, w.hash = change.Seq(bytes.Clone(v.seq)), change.Seq(bytes.Clone(v.closeSeq)), bytes.Clone(v.hash)
		c.v = &w
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
