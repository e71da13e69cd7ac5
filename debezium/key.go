package debezium

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/scd2sink/scd2sink/debezium/jsonscan"
	"strings"
	"sync/atomic"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

// keyOf takes the configured key columns from the Kafka key, else from the
// row images; with no key configured, every field of the Kafka key, in
// order. Values are typed by the key's schema (or the row's) when there is
// one.
func (d *Decoder) keyOf(ev *change.Event, r *rule, rawKey []byte, env *jsonEnvelope, row *rowSchema) ([]any, []string, error) {
	var buf [4]keyField
	fields, ks, kerr := d.keyFields(buf[:0], rawKey, &r.lastKey)
	if len(r.Keys) == 0 {
		if kerr != nil {
			return nil, nil, fmt.Errorf("message key: %w", kerr)
		}
		if len(fields) == 0 {
			return nil, nil, errors.New("message has no key and the table configures no keys")
		}
		names := ks.keyNames(fields)
		vals := ev.KeyRoom(len(fields))
		for i, f := range fields {
			v, err := typed(ks, f.name, f.v)
			if err != nil {
				return nil, nil, fmt.Errorf("message key: %w", err)
			}
			vals[i] = v
		}
		return vals, names, nil
	}
	out := ev.KeyRoom(len(r.Keys))
	for i, k := range r.Keys {
		var v any
		var err error
		for _, f := range fields {
			if f.name == k {
				v, err = typed(ks, k, f.v)
				break
			}
		}
		for _, img := range []string{"after", "before"} {
			if v != nil || err != nil {
				break
			}
			if fv := env.get([]string{img, k}); fv.Exists() {
				v, err = typed(row, k, fv)
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("key column %s: %w", k, err)
		}
		if v == nil {
			return nil, nil, fmt.Errorf("key column %s is missing", k)
		}
		out[i] = v
	}
	return out, r.Keys, nil
}

// keyField is one field of a Kafka key.
type keyField struct {
	name string
	v    gjson.Result
}

// keyFields appends the fields of a JSON Kafka key to dst in their order,
// and returns the key's schema when it was written with one.
func (d *Decoder) keyFields(dst []keyField, raw []byte, last *atomic.Pointer[cached]) ([]keyField, *rowSchema, error) {
	s := trimSpace(bytesString(raw))
	if s == "" {
		return nil, nil, errors.New("key is empty")
	}
	payload, sc, ok, err := d.unwrapJSON(s, parseKeySchema, last)
	if err != nil {
		return nil, nil, fmt.Errorf("key is not a JSON object: %w", err)
	}
	if !ok || !payload.IsObject() {
		return nil, nil, errors.New("key is not a JSON object")
	}
	var ks *rowSchema
	if sc != nil {
		if sc.err != nil {
			return nil, nil, sc.err
		}
		ks = sc.row
	}
	fields := dst
	jsonscan.ForEachMember(payload.Raw, func(k string, v gjson.Result) bool { // validated by unwrapJSON
		fields = append(fields, keyField{name: k, v: v})
		return true
	})
	return fields, ks, nil
}

// keyNames returns the fields' names: the schema's own slice when they are
// the schema's columns in order (no allocation), else copies.
func (rs *rowSchema) keyNames(fields []keyField) []string {
	if rs != nil && len(rs.names) == len(fields) {
		same := true
		for i, f := range fields {
			same = same && f.name == rs.names[i]
		}
		if same {
			return rs.names
		}
	}
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = strings.Clone(f.name)
	}
	return names
}

// typed decodes a key value by its column's schema, or without one. The
// value is detached from the record's bytes: the key outlives the record.
func typed(rs *rowSchema, name string, v gjson.Result) (any, error) {
	if rs != nil {
		if c := rs.byName[name]; c != nil {
			val, err := c.value(v)
			return detach(val), err
		}
	}
	return detach(anyValue(v)), nil
}

// detach copies the strings inside v.
func detach(v any) any {
	switch x := v.(type) {
	case string:
		return strings.Clone(x)
	case json.Number:
		return json.Number(strings.Clone(string(x)))
	case []any:
		for i := range x {
			x[i] = detach(x[i])
		}
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[strings.Clone(k)] = detach(e)
		}
		return out
	}
	return v
}
