package consumer

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"
)

// field is a Kafka Connect schema as the JsonConverter writes it.
type field struct {
	Type       string            `json:"type"`
	Name       string            `json:"name"`
	Field      string            `json:"field"`
	Fields     []field           `json:"fields"`
	Parameters map[string]string `json:"parameters"`
}

// envSchema is the value schema of a Debezium envelope.
type envSchema struct{ root field }

// row returns the schemas of the columns of the envelope's before or after.
func (s *envSchema) row(name string) map[string]field {
	for _, f := range s.root.Fields {
		if f.Field == name {
			out := map[string]field{}
			for _, c := range f.Fields {
				out[c.Field] = c
			}
			return out
		}
	}
	return nil
}

// envelope is a Debezium envelope whose fields are decoded on demand, so
// the row image can stay raw JSON (compact while the event is buffered).
type envelope struct {
	raw    map[string]json.RawMessage
	schema *envSchema
	parsed map[string]any
}

// unwrap decodes a record value: {"schema":..., "payload":...} (JsonConverter
// with schemas) or the bare envelope. A null payload returns nil.
func unwrap(value []byte) (*envelope, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(value, &top); err != nil {
		return nil, err
	}
	env := &envelope{raw: top, parsed: map[string]any{}}
	if p, ok := top["payload"]; ok {
		if s, ok := top["schema"]; ok {
			if string(bytes.TrimSpace(p)) == "null" {
				return nil, nil
			}
			var payload map[string]json.RawMessage
			if err := json.Unmarshal(p, &payload); err != nil {
				return nil, err
			}
			env.raw = payload
			var f field
			if err := json.Unmarshal(s, &f); err == nil {
				env.schema = &envSchema{root: f}
			}
		}
	}
	return env, nil
}

// field decodes one top-level field (numbers as json.Number).
func (e *envelope) field(name string) (any, bool) {
	if v, ok := e.parsed[name]; ok {
		return v, true
	}
	raw, ok := e.raw[name]
	if !ok {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	e.parsed[name] = v
	return v, true
}

// lookup follows a dot-separated path into the envelope.
func (e *envelope) lookup(path string) (any, bool) {
	segs := strings.Split(path, ".")
	cur, ok := e.field(segs[0])
	if !ok {
		return nil, false
	}
	for _, p := range segs[1:] {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// row returns the before or after image, logical types converted.
func (e *envelope) row(name string) map[string]any {
	v, _ := e.field(name)
	m, _ := v.(map[string]any)
	if m != nil && e.schema != nil {
		if _, done := e.parsed[name+"#converted"]; !done {
			convertRow(m, e.schema.row(name))
			e.parsed[name+"#converted"] = true
		}
	}
	return m
}

// afterJSON returns the after image as a JSON object: the raw bytes when
// no schema asks for conversions, else the converted image re-encoded.
func (e *envelope) afterJSON() ([]byte, error) {
	if e.schema != nil {
		m := e.row("after")
		if m == nil {
			return nil, errors.New("no after image")
		}
		return json.Marshal(m)
	}
	raw := bytes.TrimSpace(e.raw["after"])
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("no after image")
	}
	if raw[0] != '{' {
		return nil, errors.New("after image is not a JSON object")
	}
	return raw, nil
}

// convertRow turns Debezium's logical types into values the sink stores
// as such: times, dates, decimals, bytes.
func convertRow(row map[string]any, schema map[string]field) map[string]any {
	if row == nil || schema == nil {
		return row
	}
	for col, v := range row {
		f, ok := schema[col]
		if !ok || v == nil {
			continue
		}
		if cv, err := convertValue(f, v); err == nil {
			row[col] = cv
		}
	}
	return row
}

func convertValue(f field, v any) (any, error) {
	num, _ := v.(json.Number)
	str, _ := v.(string)
	switch f.Name {
	case "io.debezium.time.Date", "org.apache.kafka.connect.data.Date":
		n, err := num.Int64()
		return time.Unix(0, 0).UTC().AddDate(0, 0, int(n)), err
	case "io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp":
		n, err := num.Int64()
		return time.UnixMilli(n).UTC(), err
	case "io.debezium.time.MicroTimestamp":
		n, err := num.Int64()
		return time.UnixMicro(n).UTC(), err
	case "io.debezium.time.NanoTimestamp":
		n, err := num.Int64()
		return time.Unix(0, n).UTC(), err
	case "io.debezium.time.ZonedTimestamp":
		return time.Parse(time.RFC3339Nano, str)
	case "io.debezium.time.Time", "org.apache.kafka.connect.data.Time":
		n, err := num.Int64()
		return timeOfDay(time.Duration(n) * time.Millisecond), err
	case "io.debezium.time.MicroTime":
		n, err := num.Int64()
		return timeOfDay(time.Duration(n) * time.Microsecond), err
	case "io.debezium.time.NanoTime":
		n, err := num.Int64()
		return timeOfDay(time.Duration(n)), err
	case "org.apache.kafka.connect.data.Decimal":
		return decimal(str, f.Parameters["scale"])
	case "io.debezium.data.VariableScaleDecimal":
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("variable-scale decimal is %T", v)
		}
		s, _ := m["value"].(string)
		return decimal(s, fmt.Sprint(m["scale"]))
	}
	if f.Type == "bytes" && f.Name == "" && str != "" {
		return base64.StdEncoding.DecodeString(str)
	}
	return v, nil
}

func timeOfDay(d time.Duration) string {
	t := time.Unix(0, 0).UTC().Add(d)
	return t.Format("15:04:05.999999999")
}

// decimal decodes Kafka Connect's decimal: base64 of a big-endian two's
// complement integer, scaled by scale.
func decimal(b64, scale string) (json.Number, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return "", fmt.Errorf("decimal is not base64: %w", err)
	}
	n := new(big.Int).SetBytes(raw)
	if len(raw) > 0 && raw[0]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(len(raw)*8)))
	}
	var sc int
	if _, err := fmt.Sscan(scale, &sc); err != nil {
		return "", fmt.Errorf("decimal scale %q: %w", scale, err)
	}
	r := new(big.Rat).SetFrac(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(sc)), nil))
	return json.Number(r.FloatString(sc)), nil
}
