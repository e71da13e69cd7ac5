package sink

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
)

// unavailable marks Debezium's unavailable-value placeholder inside a typed
// row until the fold replaces it with the previous event's value.
type unavailable struct{}

// converter turns decoded event values into the Go values pgx returns when it
// scans the column, so that a value from an event and the same value read back
// from the table compare equal (see canon).
type converter struct {
	m *pgtype.Map
}

func (c converter) convert(col *colInfo, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	if s, ok := v.(string); ok && s == change.Unavailable {
		return unavailable{}, nil
	}
	switch col.oid {
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID:
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
	case pgtype.TimestamptzOID, pgtype.TimestampOID, pgtype.DateOID:
		t, err := asTime(col.oid, v)
		if err != nil {
			return nil, err
		}
		switch col.oid {
		case pgtype.TimestampOID:
			t = time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
		case pgtype.DateOID:
			t = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		}
		return t, nil
	case pgtype.JSONOID, pgtype.JSONBOID:
		return asJSON(v)
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
	typ, ok := c.m.TypeForOID(col.oid)
	if !ok {
		return asText(v), nil // enums and other text-like types
	}
	out, err := typ.Codec.DecodeValue(c.m, col.oid, pgtype.TextFormatCode, []byte(asText(v)))
	if err != nil {
		return nil, fmt.Errorf("value %q does not fit type %s: %w", asText(v), col.typeName, err)
	}
	return out, nil
}

func asText(v any) string {
	switch x := v.(type) {
	case string:
		return x
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

func asJSON(v any) (any, error) {
	var raw []byte
	switch x := v.(type) {
	case string:
		if json.Valid([]byte(x)) {
			raw = []byte(x)
		} else {
			raw, _ = json.Marshal(x)
		}
	case []byte:
		raw = x
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return nil, err
		}
		raw = b
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	return out, nil
}

// canon renders a typed value so that equal values give equal strings and
// NULL, the empty string and 0 differ.
func canon(v any) string {
	switch x := v.(type) {
	case pgtype.Numeric:
		if !x.Valid {
			return "N"
		}
		if x.NaN || x.InfinityModifier != pgtype.Finite {
			return fmt.Sprintf("Fnum:%v:%d", x.NaN, x.InfinityModifier)
		}
		r := new(big.Rat).SetInt(x.Int)
		if x.Exp > 0 {
			r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(x.Exp)), nil)))
		} else if x.Exp < 0 {
			r.Quo(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(-x.Exp)), nil)))
		}
		return "D" + r.RatString()
	case unavailable:
		return "U"
	}
	return change.Canon(v)
}

// valuesEqual is canon(a) == canon(b), with fast paths for the common types.
func valuesEqual(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case string:
		if y, ok := b.(string); ok {
			return x == y
		}
	case int64:
		if y, ok := b.(int64); ok {
			return x == y
		}
	case int32:
		if y, ok := b.(int32); ok {
			return x == y
		}
	case bool:
		if y, ok := b.(bool); ok {
			return x == y
		}
	case float64:
		if y, ok := b.(float64); ok && x == x && y == y {
			return x == y
		}
	case time.Time:
		if y, ok := b.(time.Time); ok {
			return x.Equal(y)
		}
	case []byte:
		if y, ok := b.([]byte); ok {
			return bytes.Equal(x, y)
		}
	}
	if b == nil {
		return false
	}
	return canon(a) == canon(b)
}

func rowsEqual(a, b []any, idx []int) bool {
	for _, i := range idx {
		if !valuesEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// inferType picks a column type for a value of a column the table lacks.
func inferType(v any) string {
	switch x := v.(type) {
	case bool:
		return "boolean"
	case json.Number:
		if _, err := strconv.ParseInt(x.String(), 10, 64); err == nil {
			return "bigint"
		}
		return "numeric"
	case int, int32, int64:
		return "bigint"
	case float64:
		return "double precision"
	case time.Time:
		return "timestamptz"
	case []byte:
		return "bytea"
	case map[string]any, []any:
		return "jsonb"
	case string:
		if strings.HasPrefix(x, "{") && json.Valid([]byte(x)) {
			return "jsonb"
		}
	}
	return "text"
}
