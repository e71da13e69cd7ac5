package sink

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"strings"
	"time"
	"unsafe"

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

const (
	tagNil byte = iota
	tagString
	tagInt64
	tagInt32
	tagInt16
	tagFalse
	tagTrue
	tagFloat64
	tagTime
	tagJSON
	tagBytes
	tagNumeric
	tagUnavailable
	tagFloat32
	tagUUID
	tagPgTime
	tagInterval
	tagTimestamp
	tagTimestamptz
	tagDate
)

// errUnpackable: a value has no packed form.
var errUnpackable = errors.New("no packed form")

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
	b = appendOptBytes(b, l.sideMaxSeq)
	var ok bool
	if l.sideMaxT != nil {
		if b, ok = appendTime(b, *l.sideMaxT); !ok {
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
	switch {
	case v.openAbsent == nil:
	case v.absent != nil && len(v.openAbsent) == len(v.absent) && (len(v.absent) == 0 || &v.openAbsent[0] == &v.absent[0]):
		vf |= 4 // the same slice as absent
	default:
		vf |= 8
	}
	b = append(b, vf, byte(v.op))
	b = binary.AppendVarint(b, v.id)
	b = appendOptBytes(b, v.seq)
	b = appendOptBytes(b, v.hash)
	b = appendOptBytes(b, v.closeSeq)
	for _, t := range []time.Time{v.from, v.raw, v.to} {
		if b, ok = appendTime(b, t); !ok {
			return nil, false
		}
	}
	if b, ok = appendValues(b, v.key); !ok {
		return nil, false
	}
	if b, ok = appendValues(b, v.row); !ok {
		return nil, false
	}
	b = appendStrings(b, v.unavail)
	b = appendStrings(b, v.absent)
	if vf&8 != 0 {
		b = appendStrings(b, v.openAbsent)
	}
	return b, true
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// appendOptBytes writes a byte slice whose nil-ness counts: its length plus
// one, 0 for nil.
func appendOptBytes(b, s []byte) []byte {
	if s == nil {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(s))+1)
	return append(b, s...)
}

func appendTime(b []byte, t time.Time) ([]byte, bool) {
	switch t.Location() {
	case time.UTC:
		b = append(b, 0)
	case time.Local:
		b = append(b, 1)
	default:
		return nil, false
	}
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond())), true
}

func appendStrings(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(ss))+1)
	for _, s := range ss {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

func appendValues(b []byte, vs []any) ([]byte, bool) {
	if vs == nil {
		return append(b, 0), true
	}
	b = binary.AppendUvarint(b, uint64(len(vs))+1)
	var ok bool
	for _, v := range vs {
		switch x := v.(type) {
		case nil:
			b = append(b, tagNil)
		case string:
			b = append(b, tagString)
			b = binary.AppendUvarint(b, uint64(len(x)))
			b = append(b, x...)
		case int64:
			b = binary.AppendVarint(append(b, tagInt64), x)
		case int32:
			b = binary.AppendVarint(append(b, tagInt32), int64(x))
		case int16:
			b = binary.AppendVarint(append(b, tagInt16), int64(x))
		case bool:
			if x {
				b = append(b, tagTrue)
			} else {
				b = append(b, tagFalse)
			}
		case float64:
			b = binary.LittleEndian.AppendUint64(append(b, tagFloat64), math.Float64bits(x))
		case time.Time:
			if b, ok = appendTime(append(b, tagTime), x); !ok {
				return nil, false
			}
		case json.RawMessage:
			b = appendOptBytes(append(b, tagJSON), x)
		case []byte:
			b = appendOptBytes(append(b, tagBytes), x)
		case pgtype.Numeric:
			b = appendNumeric(append(b, tagNumeric), x)
		case unavailable:
			b = append(b, tagUnavailable)
		case float32:
			b = binary.LittleEndian.AppendUint32(append(b, tagFloat32), math.Float32bits(x))
		case [16]byte:
			b = append(append(b, tagUUID), x[:]...)
		case pgtype.Time:
			b = binary.AppendVarint(append(b, tagPgTime, boolByte(x.Valid)), x.Microseconds)
		case pgtype.Interval:
			b = binary.AppendVarint(append(b, tagInterval, boolByte(x.Valid)), x.Microseconds)
			b = binary.AppendVarint(b, int64(x.Days))
			b = binary.AppendVarint(b, int64(x.Months))
		case pgtype.Timestamp:
			if b, ok = appendTime(append(b, tagTimestamp, boolByte(x.Valid), byte(int8(x.InfinityModifier))), x.Time); !ok {
				return nil, false
			}
		case pgtype.Timestamptz:
			if b, ok = appendTime(append(b, tagTimestamptz, boolByte(x.Valid), byte(int8(x.InfinityModifier))), x.Time); !ok {
				return nil, false
			}
		case pgtype.Date:
			if b, ok = appendTime(append(b, tagDate, boolByte(x.Valid), byte(int8(x.InfinityModifier))), x.Time); !ok {
				return nil, false
			}
		default:
			return nil, false
		}
	}
	return b, true
}

func appendNumeric(b []byte, n pgtype.Numeric) []byte {
	var f byte
	if n.Valid {
		f |= 1
	}
	if n.NaN {
		f |= 2
	}
	if n.Int != nil {
		f |= 4
		if n.Int.Sign() < 0 {
			f |= 8
		}
	}
	b = append(b, f, byte(int8(n.InfinityModifier)))
	b = binary.AppendVarint(b, int64(n.Exp))
	if n.Int != nil {
		words := n.Int.Bits()
		b = binary.AppendUvarint(b, uint64(len(words)))
		for _, w := range words {
			b = binary.LittleEndian.AppendUint64(b, uint64(w))
		}
	}
	return b
}

// unpacker reads a packed state; the first error sticks.
type unpacker struct {
	b     []byte
	err   error
	boxes *change.Boxes
}

func (u *unpacker) fail() {
	if u.err == nil {
		u.err = errors.New("packed cache entry is cut short")
	}
	u.b = nil
}

func (u *unpacker) byte() byte {
	if len(u.b) == 0 {
		u.fail()
		return 0
	}
	c := u.b[0]
	u.b = u.b[1:]
	return c
}

func (u *unpacker) uvarint() uint64 {
	x, n := binary.Uvarint(u.b)
	if n <= 0 {
		u.fail()
		return 0
	}
	u.b = u.b[n:]
	return x
}

func (u *unpacker) varint() int64 {
	x, n := binary.Varint(u.b)
	if n <= 0 {
		u.fail()
		return 0
	}
	u.b = u.b[n:]
	return x
}

// take returns the next n bytes, capped so that an append copies them.
func (u *unpacker) take(n uint64) []byte {
	if n > uint64(len(u.b)) {
		u.fail()
		return nil
	}
	s := u.b[:n:n]
	u.b = u.b[n:]
	return s
}

func (u *unpacker) u64() uint64 {
	if len(u.b) < 8 {
		u.fail()
		return 0
	}
	x := binary.LittleEndian.Uint64(u.b)
	u.b = u.b[8:]
	return x
}

func (u *unpacker) u32() uint32 {
	if len(u.b) < 4 {
		u.fail()
		return 0
	}
	x := binary.LittleEndian.Uint32(u.b)
	u.b = u.b[4:]
	return x
}

func (u *unpacker) optBytes() []byte {
	n := u.uvarint()
	if n == 0 {
		return nil
	}
	return u.take(n - 1)
}

func (u *unpacker) str() string {
	s := u.take(u.uvarint())
	if len(s) == 0 {
		return ""
	}
	return unsafe.String(&s[0], len(s)) // the blob is never written
}

func (u *unpacker) time() time.Time {
	loc := u.byte()
	sec := u.varint()
	nsec := u.uvarint()
	t := time.Unix(sec, int64(nsec))
	if loc == 0 {
		return t.UTC()
	}
	return t
}

func (u *unpacker) strings() []string {
	n := u.uvarint()
	if n == 0 {
		return nil
	}
	if n-1 > uint64(len(u.b)) {
		u.fail()
		return nil
	}
	ss := make([]string, n-1)
	for i := range ss {
		ss[i] = u.str()
	}
	return ss
}

func (u *unpacker) values() []any {
	n := u.uvarint()
	if n == 0 {
		return nil
	}
	if n-1 > uint64(len(u.b)) {
		u.fail()
		return nil
	}
	vs := make([]any, n-1)
	for i := range vs {
		switch tag := u.byte(); tag {
		case tagNil:
		case tagString:
			vs[i] = u.boxes.String(u.str())
		case tagInt64:
			vs[i] = u.boxes.Int64(u.varint())
		case tagInt32:
			vs[i] = u.boxes.Int32(int32(u.varint()))
		case tagInt16:
			vs[i] = int16(u.varint())
		case tagFalse:
			vs[i] = false
		case tagTrue:
			vs[i] = true
		case tagFloat64:
			vs[i] = math.Float64frombits(u.u64())
		case tagTime:
			vs[i] = u.boxes.Time(u.time())
		case tagJSON:
			vs[i] = u.boxes.JSON(u.optBytes())
		case tagBytes:
			vs[i] = u.boxes.Bytes(u.optBytes())
		case tagNumeric:
			vs[i] = u.boxes.Numeric(u.numeric())
		case tagUnavailable:
			vs[i] = unavailable{}
		case tagFloat32:
			vs[i] = math.Float32frombits(uint32(u.u32()))
		case tagUUID:
			var id [16]byte
			copy(id[:], u.take(16))
			vs[i] = id
		case tagPgTime:
			valid := u.byte() != 0
			vs[i] = pgtype.Time{Valid: valid, Microseconds: u.varint()}
		case tagInterval:
			valid := u.byte() != 0
			us := u.varint()
			days := int32(u.varint())
			vs[i] = pgtype.Interval{Valid: valid, Microseconds: us, Days: days, Months: int32(u.varint())}
		case tagTimestamp, tagTimestamptz, tagDate:
			valid := u.byte() != 0
			inf := pgtype.InfinityModifier(int8(u.byte()))
			t := u.time()
			switch tag {
			case tagTimestamp:
				vs[i] = pgtype.Timestamp{Valid: valid, InfinityModifier: inf, Time: t}
			case tagTimestamptz:
				vs[i] = pgtype.Timestamptz{Valid: valid, InfinityModifier: inf, Time: t}
			default:
				vs[i] = pgtype.Date{Valid: valid, InfinityModifier: inf, Time: t}
			}
		default:
			if u.err == nil {
				u.err = errUnpackable
			}
			return nil
		}
		if u.err != nil {
			return nil
		}
	}
	return vs
}

func (u *unpacker) numeric() pgtype.Numeric {
	f := u.byte()
	n := pgtype.Numeric{Valid: f&1 != 0, NaN: f&2 != 0, InfinityModifier: pgtype.InfinityModifier(int8(u.byte())), Exp: int32(u.varint())}
	if f&4 != 0 {
		words := u.uvarint()
		if words > uint64(len(u.b))/8 {
			u.fail()
			return n
		}
		n.Int = u.boxes.BigInt(int(words))
		ws := n.Int.Bits()
		if uint64(cap(ws)) < words {
			ws = make([]big.Word, words)
		}
		ws = ws[:words]
		for i := range ws {
			ws[i] = big.Word(u.u64())
		}
		n.Int.SetBits(ws)
		if f&8 != 0 {
			n.Int.Neg(n.Int)
		}
	}
	return n
}

// unpackLatest decodes what packLatest encoded, boxing values from boxes.
func unpackLatest(blob []byte, boxes *change.Boxes) (*latest, error) {
	u := &unpacker{b: blob, boxes: boxes}
	flags := u.byte()
	l := &latest{openerSaved: flags&1 != 0}
	l.sideMaxSeq = change.Seq(u.optBytes())
	if flags&4 != 0 {
		t := u.time()
		l.sideMaxT = &t
	}
	if flags&2 != 0 {
		vf := u.byte()
		v := &version{stored: vf&1 != 0, closed: vf&2 != 0, op: change.Op(u.byte())}
		v.id = u.varint()
		v.seq = change.Seq(u.optBytes())
		v.hash = u.optBytes()
		v.closeSeq = change.Seq(u.optBytes())
		v.from, v.raw, v.to = u.time(), u.time(), u.time()
		v.key = u.values()
		v.row = u.values()
		v.unavail = u.strings()
		v.absent = u.strings()
		switch {
		case vf&4 != 0:
			v.openAbsent = v.absent
		case vf&8 != 0:
			v.openAbsent = u.strings()
		}
		l.v = v
	}
	if u.err == nil && len(u.b) != 0 {
		u.err = errors.New("packed cache entry has trailing bytes")
	}
	if u.err != nil {
		return nil, u.err
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
