package consumer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Rule says how to decode one topic (one `tables` entry of the config).
type Rule struct {
	Topic      string
	Target     string
	Keys       []string // empty: the fields of the Kafka message key
	SequenceBy []string // envelope paths, "payload." implied
	ValidFrom  string   // envelope path
}

// Decoder turns Debezium JSON records (JsonConverter with or without
// schemas) into change events.
type Decoder struct {
	rules map[string]*Rule
}

// NewDecoder returns a Decoder for the given rules.
func NewDecoder(rules []Rule) *Decoder {
	d := &Decoder{rules: map[string]*Rule{}}
	for i := range rules {
		d.rules[rules[i].Topic] = &rules[i]
	}
	return d
}

// ErrSkip marks a record that needs no apply: a tombstone or a heartbeat.
var ErrSkip = errors.New("nothing to apply")

// Decode decodes one record. It returns ErrSkip for tombstones and
// heartbeats, and another error, naming what is wrong, for anything that
// must go to the dead-letter table.
func (d *Decoder) Decode(o change.Origin, key, value []byte) (*change.Event, error) {
	rule := d.rules[o.Topic]
	if rule == nil {
		return nil, fmt.Errorf("no table is configured for topic %q", o.Topic)
	}
	if len(bytes.TrimSpace(value)) == 0 {
		return nil, ErrSkip // tombstone
	}
	env, err := unwrap(value)
	if err != nil {
		return nil, fmt.Errorf("value is not Debezium JSON: %w", err)
	}
	if env == nil {
		return nil, ErrSkip // a null payload is a tombstone too
	}
	opRaw, ok := env.raw["op"]
	if !ok || string(opRaw) == "null" {
		if _, hb := env.raw["ts_ms"]; hb && len(env.raw) <= 2 {
			return nil, ErrSkip // a heartbeat: {"ts_ms": ...}
		}
		return nil, errors.New("envelope has no op field")
	}
	var opStr string
	if err := json.Unmarshal(opRaw, &opStr); err != nil {
		return nil, fmt.Errorf("unknown operation %s", opRaw)
	}
	op, err := change.ParseOp(opStr)
	if err != nil {
		return nil, err
	}
	ev := &change.Event{Table: rule.Target, Op: op, Origin: o}
	var parts []any
	for _, p := range rule.SequenceBy {
		v, ok := env.lookup(p)
		if !ok || v == nil {
			return nil, fmt.Errorf("sequence path %s is missing", p)
		}
		parts = append(parts, v)
	}
	if ev.Seq, err = change.SeqOf(parts...); err != nil {
		return nil, fmt.Errorf("sequence %v: %w", rule.SequenceBy, err)
	}
	if op.HasAfter() {
		if ev.AfterJSON, err = env.afterJSON(); err != nil {
			return nil, fmt.Errorf("%s event: %w", opStr, err)
		}
	}
	vf, ok := env.lookup(rule.ValidFrom)
	if !ok && strings.HasPrefix(rule.ValidFrom, "after.") {
		vf, ok = env.row("after")[strings.TrimPrefix(rule.ValidFrom, "after.")]
	}
	if !ok || vf == nil {
		return nil, fmt.Errorf("valid_from path %s is missing", rule.ValidFrom)
	}
	if ev.ValidFrom, err = asTime(rule.ValidFrom, vf); err != nil {
		return nil, fmt.Errorf("valid_from %s: %w", rule.ValidFrom, err)
	}
	if op == change.OpTruncate {
		return ev, nil
	}
	if ev.Key, ev.KeyNames, err = keyOf(rule, key, env); err != nil {
		return nil, err
	}
	return ev, nil
}

// keyOf takes the configured key columns from the Kafka key, else from the
// row images; with no key configured, every field of the Kafka key, in order.
func keyOf(rule *Rule, rawKey []byte, env *envelope) ([]any, []string, error) {
	names, vals, err := orderedKey(rawKey)
	if err != nil && len(rule.Keys) == 0 {
		return nil, nil, fmt.Errorf("message key: %w", err)
	}
	fromKey := map[string]any{}
	for i, n := range names {
		fromKey[n] = vals[i]
	}
	if len(rule.Keys) == 0 {
		if len(names) == 0 {
			return nil, nil, errors.New("message has no key and the table configures no keys")
		}
		return vals, names, nil
	}
	out := make([]any, len(rule.Keys))
	for i, k := range rule.Keys {
		v, ok := fromKey[k]
		if !ok {
			v, ok = env.row("after")[k]
		}
		if !ok {
			v, ok = env.row("before")[k]
		}
		if !ok || v == nil {
			return nil, nil, fmt.Errorf("key column %s is missing", k)
		}
		out[i] = v
	}
	return out, rule.Keys, nil
}

// orderedKey decodes the Kafka key's fields in their order (a key written
// with a schema is unwrapped first).
func orderedKey(raw []byte) ([]string, []any, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, nil, errors.New("key is empty")
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, nil, fmt.Errorf("key is not a JSON object: %w", err)
	}
	if p, ok := probe["payload"]; ok && len(probe) == 2 {
		if _, ok := probe["schema"]; ok {
			raw = p
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, errors.New("key is not a JSON object")
	}
	var names []string
	var vals []any
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, nil, err
		}
		names, vals = append(names, tok.(string)), append(vals, v)
	}
	return names, vals, nil
}

// asTime reads an envelope time: a number of milliseconds (microseconds for
// paths ending in _us, nanoseconds for _ns), or an RFC 3339 string.
func asTime(path string, v any) (time.Time, error) {
	switch x := v.(type) {
	case time.Time:
		return x, nil
	case json.Number:
		n, err := x.Int64()
		if err != nil {
			return time.Time{}, fmt.Errorf("%s is not an integer", x)
		}
		switch {
		case strings.HasSuffix(path, "_us"):
			return time.UnixMicro(n).UTC(), nil
		case strings.HasSuffix(path, "_ns"):
			return time.Unix(0, n).UTC(), nil
		}
		return time.UnixMilli(n).UTC(), nil
	case string:
		t, err := time.Parse(time.RFC3339Nano, x)
		if err != nil {
			return time.Time{}, fmt.Errorf("%q is not an RFC 3339 time", x)
		}
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%T is not a time", v)
}
