package debezium

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/scd2sink/scd2sink/internal/change"
)

var unavailableBytes = []byte(change.Unavailable)

// native decodes one goavro value of the column (logical types were
// stripped from the codec: values are Avro's primitives, records as maps,
// arrays as slices, unions wrapped). The results are those of value.
func (c *column) native(v any) (any, error) {
	if c.union {
		v = unwrapUnion(v)
	}
	return c.nativeValue(v)
}

// nativeValue is native of a value already taken out of its union (the
// envelope plan reads the union's branch itself, avroplan.go).
func (c *column) nativeValue(v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	switch x := v.(type) {
	case string:
		if x == change.Unavailable {
			return change.Unavailable, nil
		}
	case []byte:
		if bytes.Equal(x, unavailableBytes) {
			return change.Unavailable, nil
		}
	}
	switch c.kind {
	case kBool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
	case kInt16, kInt32, kInt64:
		if n, ok := avroInt(v); ok {
			return c.sizedInt(n)
		}
	case kFloat32:
		if f, ok := v.(float32); ok {
			return f, nil
		}
		if f, ok := v.(float64); ok {
			return float32(f), nil
		}
	case kFloat64:
		if f, ok := v.(float64); ok {
			return f, nil
		}
		if f, ok := v.(float32); ok {
			return float64(f), nil
		}
	case kString:
		if s, ok := v.(string); ok {
			return s, nil
		}
	case kBytes:
		if b, ok := v.([]byte); ok {
			// goavro's bytes view the record, whose buffer is reused
			// once the record is decoded (consumer/pool.go).
			return bytes.Clone(b), nil
		}
	case kDecimal:
		if b, ok := v.([]byte); ok {
			return decimalBytes(b, c.scale), nil
		}
	case kVarDecimal:
		if m, ok := v.(map[string]any); ok {
			sc, ok1 := m["scale"].(int32)
			val, ok2 := m["value"].([]byte)
			if ok1 && ok2 {
				return decimalBytes(val, sc), nil
			}
		}
	case kDate, kTimeMilli, kTimeMicro, kTimeNano, kTimestampMilli, kTimestampMicro, kTimestampNano, kMicroDuration, kMilliDuration:
		if n, ok := avroInt(v); ok {
			return c.fromInt(n)
		}
	case kZonedTimestamp, kInterval, kJSON:
		if s, ok := v.(string); ok {
			return c.fromString(s)
		}
	case kStruct:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		return json.RawMessage(b), nil
	case kArray:
		list, ok := v.([]any)
		if !ok {
			break
		}
		if len(list) == 1 {
			if s, ok := unwrapUnion(list[0]).(string); ok && s == change.Unavailable {
				return change.Unavailable, nil
			}
		}
		out := make([]any, len(list))
		for i, e := range list {
			ev, err := c.elem.native(e)
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i+1, err)
			}
			out[i] = ev
		}
		return out, nil
	}
	return nil, fmt.Errorf("a %T does not fit %s", v, c.pgType)
}

// avroInt reads Avro's int or long.
func avroInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int32:
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}
