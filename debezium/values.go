package debezium

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/scd2sink/scd2sink/debezium/jsonscan"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

// unavailableB64 is the placeholder as Debezium writes it in a bytes column.
var unavailableB64 = base64.StdEncoding.EncodeToString([]byte(change.Unavailable))

// Debezium writes PostgreSQL's ±infinity timestamps as the PostgreSQL JDBC
// driver's sentinel instants (milliseconds); anything at or beyond them, in
// any unit, is infinity.
const (
	posInfinityMillis = 9223372036825200000
	negInfinityMillis = -9223372036832400000
)

// DecodeRow implements change.RowDecoder for JSON row images.
func (r *rowSchema) DecodeRow(raw []byte) (map[string]any, error) {
	out := make(map[string]any, len(r.cols))
	err := r.VisitRow(raw, false, nil, func(name string, v any) error {
		out[name] = v
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// VisitRow implements change.RowVisitor: DecodeRow without the map.
func (r *rowSchema) VisitRow(raw []byte, valid bool, boxes *change.Boxes, fn func(name string, v any) error) error {
	// No copy: string values below share raw, which the event owns and
	// nobody writes to (they keep it alive, as they would a copy).
	s := unsafe.String(unsafe.SliceData(raw), len(raw))
	if !valid && !gjson.Valid(s) {
		return errors.New("row image is not valid JSON")
	}
	res := gjson.Parse(s)
	if !res.IsObject() {
		return errors.New("row image is not a JSON object")
	}
	var err error
	jsonscan.ForEachMember(s, func(k string, v gjson.Result) bool {
		c := r.byName[k]
		if c == nil {
			err = fn(k, anyValue(v))
			return err == nil
		}
		val, e := c.boxedValue(v, boxes)
		if e != nil {
			err = fmt.Errorf("column %s: %w", c.name, e)
			return false
		}
		err = fn(c.name, val)
		return err == nil
	})
	return err
}

// anyValue decodes a value without a schema: numbers stay exact.
func anyValue(v gjson.Result) any {
	switch v.Type {
	case gjson.Null:
		return nil
	case gjson.True:
		return true
	case gjson.False:
		return false
	case gjson.Number:
		return json.Number(v.Raw)
	case gjson.String:
		return v.Str
	}
	if v.IsArray() {
		var out []any
		v.ForEach(func(_, e gjson.Result) bool { out = append(out, anyValue(e)); return true })
		return out
	}
	m := map[string]any{}
	v.ForEach(func(k, e gjson.Result) bool { m[k.Str] = anyValue(e); return true })
	return m
}

// boxedValue is value, with the common kinds boxed from boxes.
func (c *column) boxedValue(v gjson.Result, boxes *change.Boxes) (any, error) {
	if boxes == nil || v.Type == gjson.Null {
		return c.value(v)
	}
	switch c.kind {
	case kString:
		if v.Type == gjson.String && v.Str != change.Unavailable {
			return boxes.String(v.Str), nil
		}
	case kInt64:
		if n, ok := intOf(v); ok {
			return boxes.Int64(n), nil
		}
	case kInt32:
		if n, ok := intOf(v); ok && n >= math.MinInt32 && n <= math.MaxInt32 {
			return boxes.Int32(int32(n)), nil
		}
	case kInt16:
		if n, ok := intOf(v); ok && n >= math.MinInt16 && n <= math.MaxInt16 {
			return boxes.Int16(int16(n)), nil
		}
	case kDecimal:
		if v.Type == gjson.String && v.Str != change.Unavailable {
			if n, ok := smallDecimal(v.Str, c.scale, boxes); ok {
				return boxes.Numeric(n), nil
			}
		}
	case kDate, kTimestampMilli, kTimestampMicro, kTimestampNano:
		if n, ok := intOf(v); ok && n > negInfinityMillis && n < posInfinityMillis {
			switch c.kind {
			case kDate:
				return boxes.Time(time.Date(1970, 1, 1+int(n), 0, 0, 0, 0, time.UTC)), nil
			case kTimestampMilli:
				return boxes.Time(time.UnixMilli(n).UTC()), nil
			case kTimestampMicro:
				return boxes.Time(time.UnixMicro(n).UTC()), nil
			}
			return boxes.Time(time.Unix(0, n).UTC()), nil
		}
	case kJSON:
		if v.Type == gjson.String && v.Str != change.Unavailable && gjson.Valid(v.Str) {
			return boxes.JSON(boxes.Copy(v.Str)), nil
		}
	case kZonedTimestamp:
		if v.Type == gjson.String && v.Str != change.Unavailable {
			if t, err := time.Parse(time.RFC3339Nano, v.Str); err == nil {
				return boxes.Time(t), nil
			}
		}
	}
	return c.value(v)
}

// smallDecimal decodes a decimal of up to 24 bytes from the
// slabs of boxes, as decimal would; ok is false for anything else.
func smallDecimal(b64 string, scale int32, boxes *change.Boxes) (pgtype.Numeric, bool) {
	var buf [24]byte
	if base64.StdEncoding.DecodedLen(len(b64)) > len(buf) {
		return pgtype.Numeric{}, false
	}
	n, err := base64.StdEncoding.Decode(buf[:], []byte(b64))
	if err != nil {
		return pgtype.Numeric{}, false
	}
	neg := n > 0 && buf[0]&0x80 != 0
	if neg { // two's complement: the magnitude is the bytes inverted, plus one
		carry := true
		for i := n - 1; i >= 0; i-- {
			buf[i] = ^buf[i]
			if carry {
				buf[i]++
				carry = buf[i] == 0
			}
		}
	}
	z := boxes.BigInt((n + 7) / 8).SetBytes(buf[:n])
	if neg {
		z.Neg(z)
	}
	return pgtype.Numeric{Int: z, Exp: -scale, Valid: true}, true
}

// value decodes one JSON value of the column.
func (c *column) value(v gjson.Result) (any, error) {
	if v.Type == gjson.Null {
		return nil, nil
	}
	if v.Type == gjson.String && (v.Str == change.Unavailable || (c.kind == kBytes && v.Str == unavailableB64)) {
		return change.Unavailable, nil
	}
	switch c.kind {
	case kAny:
		return anyValue(v), nil
	case kBool:
		if v.Type == gjson.True || v.Type == gjson.False {
			return v.Type == gjson.True, nil
		}
	case kInt16, kInt32, kInt64:
		if v.Type != gjson.Number {
			break
		}
		n, err := strconv.ParseInt(v.Raw, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s is not an integer", v.Raw)
		}
		return c.sizedInt(n)
	case kFloat32, kFloat64:
		var f float64
		switch v.Type {
		case gjson.Number:
			var err error
			if f, err = strconv.ParseFloat(v.Raw, 64); err != nil {
				return nil, fmt.Errorf("%s is not a number", v.Raw)
			}
		case gjson.String: // Jackson writes NaN and infinities quoted
			switch v.Str {
			case "NaN":
				f = math.NaN()
			case "Infinity":
				f = math.Inf(1)
			case "-Infinity":
				f = math.Inf(-1)
			default:
				return nil, fmt.Errorf("%q is not a number", v.Str)
			}
		default:
			return nil, fmt.Errorf("%s is not a number", v.Raw)
		}
		if c.kind == kFloat32 {
			return float32(f), nil
		}
		return f, nil
	case kString:
		if v.Type == gjson.String {
			return v.Str, nil
		}
	case kBytes:
		if v.Type == gjson.String {
			b, err := base64.StdEncoding.DecodeString(v.Str)
			if err != nil {
				return nil, fmt.Errorf("bytes are not base64: %w", err)
			}
			return b, nil
		}
	case kDecimal:
		if v.Type == gjson.String {
			return decimal(v.Str, c.scale)
		}
	case kVarDecimal:
		if v.IsObject() {
			sc, val := v.Get("scale"), v.Get("value")
			if sc.Type != gjson.Number || val.Type != gjson.String {
				return nil, fmt.Errorf("variable-scale decimal %s lacks scale or value", v.Raw)
			}
			scale, err := strconv.ParseInt(sc.Raw, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("variable-scale decimal scale %s", sc.Raw)
			}
			return decimal(val.Str, int32(scale))
		}
	case kDate, kTimeMilli, kTimeMicro, kTimeNano, kTimestampMilli, kTimestampMicro, kTimestampNano, kMicroDuration, kMilliDuration:
		if n, ok := intOf(v); ok {
			return c.fromInt(n)
		}
	case kZonedTimestamp, kInterval, kJSON:
		if v.Type == gjson.String {
			return c.fromString(v.Str)
		}
	case kStruct:
		return json.RawMessage(v.Raw), nil
	case kArray:
		if !v.IsArray() {
			break
		}
		arr := v.Array()
		if len(arr) == 1 && arr[0].Type == gjson.String && arr[0].Str == change.Unavailable {
			return change.Unavailable, nil
		}
		out := make([]any, len(arr))
		for i, e := range arr {
			ev, err := c.elem.value(e)
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i+1, err)
			}
			out[i] = ev
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s does not fit %s", clip(v.Raw), c.pgType)
}

// sizedInt returns n as the Go type of the column's integer size.
func (c *column) sizedInt(n int64) (any, error) {
	switch c.kind {
	case kInt16:
		if n < math.MinInt16 || n > math.MaxInt16 {
			return nil, fmt.Errorf("%d is out of range for smallint", n)
		}
		return int16(n), nil
	case kInt32:
		if n < math.MinInt32 || n > math.MaxInt32 {
			return nil, fmt.Errorf("%d is out of range for integer", n)
		}
		return int32(n), nil
	}
	return n, nil
}

// fromInt decodes the integer forms of Debezium's time types.
func (c *column) fromInt(n int64) (any, error) {
	switch c.kind {
	case kDate:
		return time.Date(1970, 1, 1+int(n), 0, 0, 0, 0, time.UTC), nil
	case kTimeMilli, kTimeMicro, kTimeNano:
		us := n
		switch c.kind {
		case kTimeMilli:
			us = n * 1000
		case kTimeNano:
			us = n / 1000
		}
		if us < 0 || us > 24*3600*1e6 {
			return nil, fmt.Errorf("time of day %d µs is out of range", us)
		}
		return pgtype.Time{Microseconds: us, Valid: true}, nil
	case kTimestampMilli, kTimestampMicro, kTimestampNano:
		switch {
		case n >= posInfinityMillis:
			return pgtype.Timestamp{InfinityModifier: pgtype.Infinity, Valid: true}, nil
		case n <= negInfinityMillis:
			return pgtype.Timestamp{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, nil
		case c.kind == kTimestampMilli:
			return time.UnixMilli(n).UTC(), nil
		case c.kind == kTimestampMicro:
			return time.UnixMicro(n).UTC(), nil
		}
		return time.Unix(0, n).UTC(), nil
	case kMicroDuration:
		return pgtype.Interval{Microseconds: n, Valid: true}, nil
	case kMilliDuration:
		return pgtype.Interval{Microseconds: n * 1000, Valid: true}, nil
	}
	return nil, fmt.Errorf("%d does not fit %s", n, c.pgType)
}

// fromString decodes the string forms of Debezium's semantic types.
func (c *column) fromString(s string) (any, error) {
	switch c.kind {
	case kZonedTimestamp:
		switch s {
		case "infinity", "+infinity":
			return pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}, nil
		case "-infinity":
			return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, nil
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return nil, fmt.Errorf("%q is not an ISO 8601 timestamp", clip(s))
		}
		return t, nil
	case kInterval:
		return isoInterval(s)
	case kJSON:
		if !gjson.Valid(s) {
			return nil, fmt.Errorf("%q is not JSON", clip(s))
		}
		return json.RawMessage(s), nil
	}
	return nil, fmt.Errorf("%q does not fit %s", clip(s), c.pgType)
}

func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

func intOf(v gjson.Result) (int64, bool) {
	if v.Type != gjson.Number {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	return n, err == nil
}

// decimal decodes Kafka Connect's decimal: base64 of a big-endian two's
// complement integer, scaled by scale. The scale is kept.
func decimal(b64 string, scale int32) (pgtype.Numeric, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return pgtype.Numeric{}, fmt.Errorf("decimal is not base64: %w", err)
	}
	return decimalBytes(raw, scale), nil
}

// decimalBytes is decimal from the integer's bytes, as Avro carries them.
func decimalBytes(raw []byte, scale int32) pgtype.Numeric {
	n := new(big.Int).SetBytes(raw)
	if len(raw) > 0 && raw[0]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(len(raw)*8)))
	}
	return pgtype.Numeric{Int: n, Exp: -scale, Valid: true}
}

// isoInterval parses the ISO 8601 duration Debezium writes for
// interval.handling.mode=string ("P1Y2M3DT4H5M6.78S", components may be
// negative).
func isoInterval(s string) (pgtype.Interval, error) {
	bad := fmt.Errorf("%q is not an ISO 8601 duration", clip(s))
	if !strings.HasPrefix(s, "P") {
		return pgtype.Interval{}, bad
	}
	var iv pgtype.Interval
	inTime := false
	rest := s[1:]
	for rest != "" {
		if rest[0] == 'T' {
			inTime, rest = true, rest[1:]
			continue
		}
		i := 0
		for i < len(rest) && (rest[i] == '-' || rest[i] == '+' || rest[i] == '.' || (rest[i] >= '0' && rest[i] <= '9')) {
			i++
		}
		if i == 0 || i == len(rest) {
			return pgtype.Interval{}, bad
		}
		num, unit := rest[:i], rest[i]
		rest = rest[i+1:]
		if unit == 'S' && inTime {
			f, err := strconv.ParseFloat(num, 64)
			if err != nil {
				return pgtype.Interval{}, bad
			}
			iv.Microseconds += int64(math.Round(f * 1e6))
			continue
		}
		n, err := strconv.ParseInt(num, 10, 32)
		if err != nil {
			return pgtype.Interval{}, bad
		}
		switch {
		case unit == 'Y' && !inTime:
			iv.Months += int32(n) * 12
		case unit == 'M' && !inTime:
			iv.Months += int32(n)
		case unit == 'W' && !inTime:
			iv.Days += int32(n) * 7
		case unit == 'D' && !inTime:
			iv.Days += int32(n)
		case unit == 'H' && inTime:
			iv.Microseconds += n * 3600e6
		case unit == 'M' && inTime:
			iv.Microseconds += n * 60e6
		default:
			return pgtype.Interval{}, bad
		}
	}
	iv.Valid = true
	return iv, nil
}
