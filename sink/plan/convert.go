package plan

import (
	"database/sql/driver"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/pgcodec"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

// Unavailable marks Debezium's unavailable-value placeholder inside a typed
// row until the fold replaces it with the previous event's value.
type Unavailable = change.UnavailableValue

// Converter turns decoded event values into the Go values pgx returns when it
// scans the column, so that a value from an event and the same value read back
// from the table compare equal (see canon).
type Converter struct {
	m *pgtype.Map
}

// NewConverter returns a converter with its own type map (pgx's maps are
// not safe for concurrent use).
func NewConverter() Converter { return Converter{m: pgtype.NewMap()} }

// storedValue is a value read back from a history table's column (by
// pgx, with the sink's types registered): already what convert returns for
// that column, taken as it is. Keys read from the table (a snapshot
// reconciliation's) are never round-tripped through text.
type storedValue struct{ v any }

// MarshalJSON writes the value as a dead letter's key shows it.
func (s storedValue) MarshalJSON() ([]byte, error) { return json.Marshal(s.v) }

// String writes the value as fmt writes what it holds.
func (s storedValue) String() string { return fmt.Sprint(s.v) }

// Stored marks v as read back from a history table's column by pgx, with
// the sink's types registered (pgcodec.Register) and the column's type:
// the sink takes it as it is, without converting it again. Carried
// versions (package carry) and reconciliation's keys come this way.
func Stored(v any) any { return storedValue{v} }

// Convert turns v, decoded from an event, into the value pgx returns
// when it scans col, or fails when v does not fit col's type.
func (c Converter) Convert(col *catalog.ColumnInfo, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	if x, ok := v.(storedValue); ok {
		return x.v, nil
	}
	if s, ok := v.(string); ok && s == change.Unavailable {
		return Unavailable{}, nil
	}
	if same(col.OID, v) {
		return v, nil // already what the column holds: no copy, no new box
	}
	switch col.OID {
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID: // isText
		return asText(v), nil
	case pgtype.BoolOID:
		switch x := v.(type) {
		case bool:
			return x, nil
		case string:
			b, err := strconv.ParseBool(x)
			if err != nil {
				return nil, fmt.Errorf("not a boolean: %q", x)
			}
			return b, nil
		case json.Number:
			return x.String() != "0", nil
		}
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID:
		if n, ok := intValue(v); ok {
			return sizedInt(col, n)
		}
	case pgtype.Float8OID:
		switch x := v.(type) {
		case float64:
			return x, nil
		case float32:
			return float64(x), nil
		}
	case pgtype.Float4OID:
		if x, ok := v.(float32); ok {
			return x, nil
		}
	case pgtype.NumericOID:
		if x, ok := v.(pgtype.Numeric); ok {
			return x, nil
		}
	case pgtype.TimestamptzOID, pgtype.TimestampOID, pgtype.DateOID:
		if _, inf := fold.InfinityCanon(v); inf {
			im, _ := infinityOf(v)
			switch col.OID {
			case pgtype.TimestamptzOID:
				return pgtype.Timestamptz{InfinityModifier: im, Valid: true}, nil
			case pgtype.TimestampOID:
				return pgtype.Timestamp{InfinityModifier: im, Valid: true}, nil
			}
			return pgtype.Date{InfinityModifier: im, Valid: true}, nil
		}
		t, err := asTime(col.OID, v)
		if err != nil {
			return nil, err
		}
		// PostgreSQL keeps microseconds: what is stored is what compares.
		t = t.Truncate(time.Microsecond)
		switch col.OID {
		case pgtype.TimestampOID:
			t = time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
		case pgtype.DateOID:
			t = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		}
		return t, nil
	case pgtype.TimeOID:
		if x, ok := v.(pgtype.Time); ok {
			return x, nil
		}
	case pgtype.IntervalOID:
		if x, ok := v.(pgtype.Interval); ok {
			return x, nil
		}
	case pgtype.JSONOID, pgtype.JSONBOID:
		return asJSON(v)
	case pgtype.TimetzOID:
		switch x := v.(type) {
		case pgcodec.Timetz:
			return x, nil
		case string:
			return pgcodec.ParseTimetz(x)
		}
	case pgtype.XMLOID:
		return []byte(asText(v)), nil
	case pgtype.ByteaOID:
		switch x := v.(type) {
		case []byte:
			return x, nil
		case string:
			b, err := base64.StdEncoding.DecodeString(x)
			if err != nil {
				return []byte(x), nil
			}
			return b, nil
		}
	}
	typ, ok := c.m.TypeForOID(col.OID)
	if !ok {
		return asText(v), nil // enums and other text-like types
	}
	if arr, isArr := typ.Codec.(*pgtype.ArrayCodec); isArr {
		if list, ok := v.([]any); ok {
			return c.convertArray(col, arr.ElementType, list)
		}
	}
	out, err := typ.Codec.DecodeValue(c.m, col.OID, pgtype.TextFormatCode, []byte(asText(v)))
	if err != nil {
		return nil, fmt.Errorf("value %q does not fit type %s: %w", asText(v), col.TypeName, err)
	}
	return out, nil
}

// same reports whether v is already the value convert would return for a
// column of type oid (the common case for events decoded with a schema).
func same(oid uint32, v any) bool {
	switch x := v.(type) {
	case string:
		return pgcodec.IsText(oid)
	case int64:
		return oid == pgtype.Int8OID
	case int32:
		return oid == pgtype.Int4OID
	case int16:
		return oid == pgtype.Int2OID
	case bool:
		return oid == pgtype.BoolOID
	case float64:
		return oid == pgtype.Float8OID
	case pgtype.Numeric:
		return oid == pgtype.NumericOID
	case time.Time:
		switch oid {
		case pgtype.TimestamptzOID:
			return x.Nanosecond()%1000 == 0
		case pgtype.TimestampOID:
			return x.Nanosecond()%1000 == 0 && x.Location() == time.UTC
		case pgtype.DateOID:
			return x.Location() == time.UTC && x.Hour() == 0 && x.Minute() == 0 && x.Second() == 0 && x.Nanosecond() == 0
		}
	}
	return false
}

// convertArray converts each element of an array value.
func (c Converter) convertArray(col *catalog.ColumnInfo, elem *pgtype.Type, list []any) (any, error) {
	ec := &catalog.ColumnInfo{Name: col.Name, OID: elem.OID, TypeName: elem.Name}
	out := make([]any, len(list))
	for i, e := range list {
		v, err := c.Convert(ec, e)
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i+1, err)
		}
		if _, ok := v.(Unavailable); ok {
			return nil, fmt.Errorf("element %d is Debezium's unavailable-value placeholder", i+1)
		}
		out[i] = v
	}
	return out, nil
}

func infinityOf(v any) (pgtype.InfinityModifier, bool) {
	switch x := v.(type) {
	case pgtype.InfinityModifier:
		return x, true
	case pgtype.Timestamptz:
		return x.InfinityModifier, true
	case pgtype.Timestamp:
		return x.InfinityModifier, true
	case pgtype.Date:
		return x.InfinityModifier, true
	}
	return 0, false
}

// intValue reads an integer from a decoded value.
func intValue(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case int32:
		return int64(x), true
	case int16:
		return int64(x), true
	case int:
		return int64(x), true
	case json.Number:
		n, err := strconv.ParseInt(string(x), 10, 64)
		return n, err == nil
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// sizedInt returns n as the Go type pgx reads the column's type into.
func sizedInt(col *catalog.ColumnInfo, n int64) (any, error) {
	switch col.OID {
	case pgtype.Int2OID:
		if n < math.MinInt16 || n > math.MaxInt16 {
			return nil, fmt.Errorf("%d is out of range for smallint", n)
		}
		return int16(n), nil
	case pgtype.Int4OID:
		if n < math.MinInt32 || n > math.MaxInt32 {
			return nil, fmt.Errorf("%d is out of range for integer", n)
		}
		return int32(n), nil
	}
	return n, nil
}

func asText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.RawMessage:
		return string(x)
	case driver.Valuer: // pgtype's Numeric, Time, Interval, Timestamp...
		if val, err := x.Value(); err == nil {
			if t, ok := val.(time.Time); ok {
				return t.Format(time.RFC3339Nano)
			}
			return fmt.Sprint(val)
		}
		return fmt.Sprint(x)
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	case time.Time:
		return x.Format(time.RFC3339Nano)
	case []byte:
		return base64.StdEncoding.EncodeToString(x)
	case map[string]any, []any:
		b, _ := json.Marshal(x)
		return string(b)
	default:
		return fmt.Sprint(x)
	}
}

var timeLayouts = []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999Z07:00", "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999", "2006-01-02"}

func asTime(oid uint32, v any) (time.Time, error) {
	switch x := v.(type) {
	case time.Time:
		return x, nil
	case string:
		for _, l := range timeLayouts {
			if t, err := time.Parse(l, x); err == nil {
				return t, nil
			}
		}
		return time.Time{}, fmt.Errorf("not a time: %q", x)
	case json.Number:
		n, err := x.Int64()
		if err == nil && oid == pgtype.DateOID {
			return time.Unix(0, 0).UTC().AddDate(0, 0, int(n)), nil
		}
		return time.Time{}, fmt.Errorf("number %s for a time column: the decoder must turn Debezium time types into times", x)
	}
	return time.Time{}, fmt.Errorf("not a time: %T", v)
}

// asJSON returns a JSON column's value as its exact text: a string or
// json.RawMessage holding JSON is taken as it is (a JSON null, big numbers
// and trailing zeros included); a string that is not JSON is stored as a
// JSON string; other values are marshalled.
func asJSON(v any) (any, error) {
	switch x := v.(type) {
	case json.RawMessage:
		if !gjson.ValidBytes(x) {
			return nil, fmt.Errorf("not JSON: %q", pgcodec.ClipText(string(x)))
		}
		return v, nil
	case string:
		if json.Valid([]byte(x)) {
			return json.RawMessage(x), nil
		}
		b, _ := json.Marshal(x)
		return json.RawMessage(b), nil
	case []byte:
		if json.Valid(x) {
			return json.RawMessage(x), nil
		}
		return nil, fmt.Errorf("not JSON: %q", pgcodec.ClipText(string(x)))
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	return json.RawMessage(b), nil
}
