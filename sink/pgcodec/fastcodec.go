package pgcodec

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Binary encoders for the most frequent values of a COPY that pgx encodes
// at a cost: a time.Time for timestamptz, timestamp and date (pgx wraps
// each value, an allocation per value) and a decimal (pgx works through
// math/big, several allocations per value). These produce exactly pgx's bytes
// (TestFastCodecsMatchPgx); anything else goes to pgx's own codecs.

// fastTimestamptzCodec is pgx's timestamptz codec with a direct binary
// plan for time.Time.
type fastTimestamptzCodec struct{ *pgtype.TimestamptzCodec }

// PlanEncode implements pgtype.Codec.
func (c fastTimestamptzCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(time.Time); ok && format == pgtype.BinaryFormatCode {
		return timestamptzBinary{}
	}
	return c.TimestamptzCodec.PlanEncode(m, oid, format, value)
}

type timestamptzBinary struct{}

// microsecFromUnixEpochToY2K is PostgreSQL's epoch, 2000-01-01, in Unix
// microseconds.
const microsecFromUnixEpochToY2K = 946_684_800 * 1_000_000

func (timestamptzBinary) Encode(value any, buf []byte) ([]byte, error) {
	t := value.(time.Time)
	us := t.Unix()*1_000_000 + int64(t.Nanosecond())/1000
	return binary.BigEndian.AppendUint64(buf, uint64(us-microsecFromUnixEpochToY2K)), nil
}

// fastTimestampCodec is pgx's timestamp codec with a direct binary plan
// for time.Time (its wall clock, as pgx takes it).
type fastTimestampCodec struct{ *pgtype.TimestampCodec }

// PlanEncode implements pgtype.Codec.
func (c fastTimestampCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(time.Time); ok && format == pgtype.BinaryFormatCode {
		return timestampBinary{}
	}
	return c.TimestampCodec.PlanEncode(m, oid, format, value)
}

type timestampBinary struct{}

func (timestampBinary) Encode(value any, buf []byte) ([]byte, error) {
	t := value.(time.Time)
	if t.Location() != time.UTC {
		t = time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
	}
	us := t.Unix()*1_000_000 + int64(t.Nanosecond())/1000
	return binary.BigEndian.AppendUint64(buf, uint64(us-microsecFromUnixEpochToY2K)), nil
}

// fastDateCodec is pgx's date codec with a direct binary plan for
// time.Time (its calendar day).
type fastDateCodec struct{ pgtype.DateCodec }

// PlanEncode implements pgtype.Codec.
func (c fastDateCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(time.Time); ok && format == pgtype.BinaryFormatCode {
		return dateBinary{}
	}
	return c.DateCodec.PlanEncode(m, oid, format, value)
}

type dateBinary struct{}

// y2kUnix is PostgreSQL's epoch in Unix seconds.
const y2kUnix = 946_684_800

func (dateBinary) Encode(value any, buf []byte) ([]byte, error) {
	t := value.(time.Time)
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC).Unix()
	return binary.BigEndian.AppendUint32(buf, uint32(int32((day-y2kUnix)/86400))), nil
}

// fastNumericCodec is pgx's numeric codec with a binary plan for finite
// decimals of up to 15 digits and a scale of at most 16, in 64-bit
// integers.
type fastNumericCodec struct{ pgtype.NumericCodec }

// PlanEncode implements pgtype.Codec.
func (c fastNumericCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(pgtype.Numeric); ok && format == pgtype.BinaryFormatCode {
		return numericBinary{slow: c.NumericCodec.PlanEncode(m, oid, format, value)}
	}
	return c.NumericCodec.PlanEncode(m, oid, format, value)
}

type numericBinary struct{ slow pgtype.EncodePlan }

func (p numericBinary) Encode(value any, buf []byte) ([]byte, error) {
	if out, ok := appendNumeric(buf, value.(pgtype.Numeric)); ok {
		return out, nil
	}
	return p.slow.Encode(value, buf)
}

// appendNumeric appends n in PostgreSQL's binary form, as pgx does; ok is
// false, and nothing appended, for a value off the fast path (pgx's own
// plan encodes those).
func appendNumeric(buf []byte, n pgtype.Numeric) ([]byte, bool) {
	if !n.Valid || n.NaN || n.InfinityModifier != pgtype.Finite || n.Int == nil || !n.Int.IsInt64() || n.Exp < -18 || n.Exp > 64 {
		return buf, false
	}
	v := n.Int.Int64()
	abs := uint64(v)
	if v < 0 {
		abs = uint64(-(v + 1)) + 1
	}
	if abs > 1e15 {
		return buf, false
	}
	// As pgx does: the exponent made a multiple of 4, for base 10,000.
	exp := n.Exp
	switch n.Exp % 4 {
	case 1, -3:
		exp, abs = n.Exp-1, abs*10
	case 2, -2:
		exp, abs = n.Exp-2, abs*100
	case 3, -1:
		exp, abs = n.Exp-3, abs*1000
	}
	if exp < -16 {
		return buf, false // 10^-exp is past 64 bits
	}
	whole, frac := abs, uint64(0)
	if exp < 0 {
		div := uint64(1)
		for range -exp {
			div *= 10
		}
		whole, frac = abs/div, abs%div+div // the leading 1 keeps leading zero groups
	}
	var digits [12]int16 // at most 5 whole and 4 fractional groups
	nw := 0
	for ; whole != 0; whole /= 10000 {
		digits[nw] = int16(whole % 10000)
		nw++
	}
	nf := 0
	if frac != 0 {
		for ; frac != 1; frac /= 10000 {
			digits[nw+nf] = int16(frac % 10000)
			nf++
		}
	}
	var weight int
	if nw > 0 {
		weight = nw - 1
		if exp > 0 {
			weight += int(exp) / 4
		}
	} else {
		weight = int(exp)/4 - 1 + nf
	}
	if weight > math.MaxInt16 || weight < math.MinInt16 {
		return buf, false
	}
	var sign uint16
	if v < 0 {
		sign = 16384
	}
	var dscale uint16
	if n.Exp < 0 {
		dscale = uint16(-n.Exp)
	}
	buf = binary.BigEndian.AppendUint16(buf, uint16(nw+nf))
	buf = binary.BigEndian.AppendUint16(buf, uint16(int16(weight)))
	buf = binary.BigEndian.AppendUint16(buf, sign)
	buf = binary.BigEndian.AppendUint16(buf, dscale)
	for i := nw - 1; i >= 0; i-- {
		buf = binary.BigEndian.AppendUint16(buf, uint16(digits[i]))
	}
	for i := nf - 1; i >= 0; i-- {
		buf = binary.BigEndian.AppendUint16(buf, uint16(digits[nw+i]))
	}
	return buf, true
}

// fastTypes are the types above and their arrays, registered with the
// JSON types (Register).
func fastTypes() []*pgtype.Type {
	ts := &pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID, Codec: fastTimestamptzCodec{&pgtype.TimestamptzCodec{}}}
	num := &pgtype.Type{Name: "numeric", OID: pgtype.NumericOID, Codec: fastNumericCodec{}}
	tsn := &pgtype.Type{Name: "timestamp", OID: pgtype.TimestampOID, Codec: fastTimestampCodec{&pgtype.TimestampCodec{}}}
	date := &pgtype.Type{Name: "date", OID: pgtype.DateOID, Codec: fastDateCodec{}}
	return []*pgtype.Type{ts, num, tsn, date,
		{Name: "_timestamptz", OID: pgtype.TimestamptzArrayOID, Codec: &pgtype.ArrayCodec{ElementType: ts}},
		{Name: "_numeric", OID: pgtype.NumericArrayOID, Codec: &pgtype.ArrayCodec{ElementType: num}},
		{Name: "_timestamp", OID: pgtype.TimestampArrayOID, Codec: &pgtype.ArrayCodec{ElementType: tsn}},
		{Name: "_date", OID: pgtype.DateArrayOID, Codec: &pgtype.ArrayCodec{ElementType: date}},
	}
}
