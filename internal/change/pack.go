package change

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgtype"
)

// The packed form of typed values (AppendValues, Unpacker.Values): a tag
// byte per value, then its bytes; exact, nil and empty told apart, times
// in UTC or Local only. The sink keeps its cached states in it, and an
// Avro event its row image while it waits in the sequencer's buffer: one
// byte slice the collector marks but never scans, where the values would
// be a dozen objects.

// UnavailableValue is the typed form of Debezium's unavailable-value
// placeholder once a row's values are converted to their columns' types
// (the sink's), so that the packed form can hold it.
type UnavailableValue struct{}

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

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// AppendOptBytes writes a byte slice whose nil-ness counts: its length plus
// one, 0 for nil.
func AppendOptBytes(b, s []byte) []byte {
	if s == nil {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(s))+1)
	return append(b, s...)
}

// AppendTime appends t, or reports false for a time in a zone other
// than UTC and Local.
func AppendTime(b []byte, t time.Time) ([]byte, bool) {
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

// AppendStrings appends ss, nil told from empty.
func AppendStrings(b []byte, ss []string) []byte {
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

// AppendValues appends vs, or reports false when a value's type has no
// packed form (arrays, timetz, inet, times in a named zone, ...).
func AppendValues(b []byte, vs []any) ([]byte, bool) {
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
			if b, ok = AppendTime(append(b, tagTime), x); !ok {
				return nil, false
			}
		case json.RawMessage:
			b = AppendOptBytes(append(b, tagJSON), x)
		case []byte:
			b = AppendOptBytes(append(b, tagBytes), x)
		case pgtype.Numeric:
			b = appendPackedNumeric(append(b, tagNumeric), x)
		case UnavailableValue:
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
			if b, ok = AppendTime(append(b, tagTimestamp, boolByte(x.Valid), byte(int8(x.InfinityModifier))), x.Time); !ok {
				return nil, false
			}
		case pgtype.Timestamptz:
			if b, ok = AppendTime(append(b, tagTimestamptz, boolByte(x.Valid), byte(int8(x.InfinityModifier))), x.Time); !ok {
				return nil, false
			}
		case pgtype.Date:
			if b, ok = AppendTime(append(b, tagDate, boolByte(x.Valid), byte(int8(x.InfinityModifier))), x.Time); !ok {
				return nil, false
			}
		default:
			return nil, false
		}
	}
	return b, true
}

func appendPackedNumeric(b []byte, n pgtype.Numeric) []byte {
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

// Unpacker reads packed values in the order they were appended; the first
// error sticks, and what follows it reads as zero values.
type Unpacker struct {
	b     []byte
	err   error
	boxes *Boxes
}

// NewUnpacker reads b, boxing values from boxes (nil: the ordinary way).
// Strings and byte slices it returns share b, which must never be written
// again; byte slices are capped, so that an append copies them.
func NewUnpacker(b []byte, boxes *Boxes) Unpacker {
	return Unpacker{b: b, boxes: boxes}
}

// Done returns the first error met, or an error if bytes are left over.
func (u *Unpacker) Done() error {
	if u.err == nil && len(u.b) != 0 {
		u.err = errors.New("packed values have trailing bytes")
	}
	return u.err
}

func (u *Unpacker) fail() {
	if u.err == nil {
		u.err = errors.New("packed values are cut short")
	}
	u.b = nil
}

// Byte reads a byte.
func (u *Unpacker) Byte() byte {
	if len(u.b) == 0 {
		u.fail()
		return 0
	}
	c := u.b[0]
	u.b = u.b[1:]
	return c
}

func (u *Unpacker) uvarint() uint64 {
	x, n := binary.Uvarint(u.b)
	if n <= 0 {
		u.fail()
		return 0
	}
	u.b = u.b[n:]
	return x
}

// Varint reads a signed varint.
func (u *Unpacker) Varint() int64 {
	x, n := binary.Varint(u.b)
	if n <= 0 {
		u.fail()
		return 0
	}
	u.b = u.b[n:]
	return x
}

// take returns the next n bytes, capped so that an append copies them.
func (u *Unpacker) take(n uint64) []byte {
	if n > uint64(len(u.b)) {
		u.fail()
		return nil
	}
	s := u.b[:n:n]
	u.b = u.b[n:]
	return s
}

func (u *Unpacker) u64() uint64 {
	if len(u.b) < 8 {
		u.fail()
		return 0
	}
	x := binary.LittleEndian.Uint64(u.b)
	u.b = u.b[8:]
	return x
}

func (u *Unpacker) u32() uint32 {
	if len(u.b) < 4 {
		u.fail()
		return 0
	}
	x := binary.LittleEndian.Uint32(u.b)
	u.b = u.b[4:]
	return x
}

// OptBytes reads what AppendOptBytes wrote.
func (u *Unpacker) OptBytes() []byte {
	n := u.uvarint()
	if n == 0 {
		return nil
	}
	return u.take(n - 1)
}

func (u *Unpacker) str() string {
	s := u.take(u.uvarint())
	if len(s) == 0 {
		return ""
	}
	return unsafe.String(&s[0], len(s)) // the blob is never written
}

// Time reads what AppendTime wrote.
func (u *Unpacker) Time() time.Time {
	loc := u.Byte()
	sec := u.Varint()
	nsec := u.uvarint()
	t := time.Unix(sec, int64(nsec))
	if loc == 0 {
		return t.UTC()
	}
	return t
}

// count reads a list's length plus one; ok is false for a nil list (0)
// and for a length the bytes left cannot hold (each entry takes one at
// least).
func (u *Unpacker) count() (int, bool) {
	n := u.uvarint()
	if n == 0 {
		return 0, false
	}
	if n-1 > uint64(len(u.b)) {
		u.fail()
		return 0, false
	}
	return int(n - 1), true
}

// Strings reads what AppendStrings wrote.
func (u *Unpacker) Strings() []string {
	n, ok := u.count()
	if !ok {
		return nil
	}
	ss := make([]string, n)
	for i := range ss {
		ss[i] = u.str()
	}
	return ss
}

// Values reads what AppendValues wrote.
func (u *Unpacker) Values() []any {
	n, ok := u.count()
	if !ok {
		return nil
	}
	vs := u.boxes.Anys(n)
	for i := range vs {
		switch tag := u.Byte(); tag {
		case tagNil:
		case tagString:
			vs[i] = u.boxes.String(u.str())
		case tagInt64:
			vs[i] = u.boxes.Int64(u.Varint())
		case tagInt32:
			vs[i] = u.boxes.Int32(int32(u.Varint()))
		case tagInt16:
			vs[i] = u.boxes.Int16(int16(u.Varint()))
		case tagFalse:
			vs[i] = false
		case tagTrue:
			vs[i] = true
		case tagFloat64:
			vs[i] = math.Float64frombits(u.u64())
		case tagTime:
			vs[i] = u.boxes.Time(u.Time())
		case tagJSON:
			vs[i] = u.boxes.JSON(u.OptBytes())
		case tagBytes:
			vs[i] = u.boxes.Bytes(u.OptBytes())
		case tagNumeric:
			vs[i] = u.boxes.Numeric(u.numeric())
		case tagUnavailable:
			vs[i] = UnavailableValue{}
		case tagFloat32:
			vs[i] = math.Float32frombits(uint32(u.u32()))
		case tagUUID:
			var id [16]byte
			copy(id[:], u.take(16))
			vs[i] = id
		case tagPgTime:
			valid := u.Byte() != 0
			vs[i] = pgtype.Time{Valid: valid, Microseconds: u.Varint()}
		case tagInterval:
			valid := u.Byte() != 0
			us := u.Varint()
			days := int32(u.Varint())
			vs[i] = pgtype.Interval{Valid: valid, Microseconds: us, Days: days, Months: int32(u.Varint())}
		case tagTimestamp, tagTimestamptz, tagDate:
			valid := u.Byte() != 0
			inf := pgtype.InfinityModifier(int8(u.Byte()))
			t := u.Time()
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

func (u *Unpacker) numeric() pgtype.Numeric {
	f := u.Byte()
	n := pgtype.Numeric{Valid: f&1 != 0, NaN: f&2 != 0, InfinityModifier: pgtype.InfinityModifier(int8(u.Byte())), Exp: int32(u.Varint())}
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
