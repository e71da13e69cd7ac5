package erasure

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// Every form a key takes (DESIGN.md section 12). A key's identity is
// keyID of its values converted to the key columns' types: what writers
// hash, what the history holds. A dead letter keeps its key in another
// form — the record's message key (Debezium's JSON with or without a
// schema, Avro: epoch numbers, ISO text, base64), or for one rejected
// after decoding the decoded values as a JSON array — and a primary-key
// change's headers name a key as the message key's JSON. letterKeyIDs
// reads each form back into values (Config.DecodeKey, as the decoder
// reads an event's key), converts them as an event's key is converted,
// and returns the identities they may stand for: one, or, where a bare
// number could be a time in milliseconds, microseconds or nanoseconds
// (a key without a schema), each reading. Erase and the writers' filter
// match these against the erased identities: one pass over the dead
// letters, whatever the keys' types.

// maxKeyReadings bounds the identities one key form stands for.
const maxKeyReadings = 64

// decodeKeyWait bounds how long reading one key back may wait (a schema
// registry that does not answer): it runs inside transactions that hold
// writers' locks. A key not read in time is one that cannot be read.
const decodeKeyWait = 5 * time.Second

// keyReading is one reading of a key form: its values as the key
// columns' types, and its identity.
type keyReading struct {
	vals []any
	id   string
}

// letterKeyIDs returns the identities a dead letter's key may stand for
// in a table of key columns kc; ok is false when the key cannot be read
// at all.
func (s *Set) letterKeyIDs(ctx context.Context, kc []catalog.ColumnInfo, d *plan.DeadLetter) ([]keyReading, bool) {
	if d.KeyID != "" {
		return []keyReading{{id: d.KeyID}}, true
	}
	if d.Decoded {
		var arr []json.RawMessage
		if json.Unmarshal(d.Key, &arr) != nil || len(arr) != len(kc) {
			return nil, false
		}
		vals := make([]any, len(arr))
		for i, r := range arr {
			vals[i] = jsonValue(r)
		}
		return s.keyIDsOf(kc, nil, vals)
	}
	return s.recordKeyIDs(ctx, kc, d.Origin.Topic, d.Key, d.Headers)
}

// recordKeyIDs reads a record's message key (or a header's).
func (s *Set) recordKeyIDs(ctx context.Context, kc []catalog.ColumnInfo, topic string, key []byte, hs []plan.Header) ([]keyReading, bool) {
	if s.decodeKey != nil {
		dctx, cancel := context.WithTimeout(ctx, decodeKeyWait)
		vals, names, err := s.decodeKey(dctx, topic, key, hs)
		cancel()
		if err == nil {
			if ids, ok := s.keyIDsOf(kc, names, vals); ok {
				return ids, true
			}
		}
	}
	// Plain JSON: an object of the key's fields, or Debezium's
	// {"schema", "payload"} around it.
	var obj map[string]json.RawMessage
	if json.Unmarshal(key, &obj) != nil {
		return nil, false
	}
	if p, ok := obj["payload"]; ok && obj["schema"] != nil {
		obj = nil
		if json.Unmarshal(p, &obj) != nil {
			return nil, false
		}
	}
	names := make([]string, 0, len(obj))
	vals := make([]any, 0, len(obj))
	for n, r := range obj {
		names, vals = append(names, n), append(vals, jsonValue(r))
	}
	return s.keyIDsOf(kc, names, vals)
}

// jsonValue decodes one JSON value as the schemaless decoder would
// (numbers kept as json.Number); an object holding Microseconds is a
// pgtype.Time as encoding/json writes it.
func jsonValue(r json.RawMessage) any {
	var v any
	d := json.NewDecoder(strings.NewReader(string(r)))
	d.UseNumber()
	if d.Decode(&v) != nil {
		return string(r)
	}
	if m, ok := v.(map[string]any); ok {
		if us, ok := m["Microseconds"].(json.Number); ok {
			n, err := us.Int64()
			if err == nil {
				return pgtype.Time{Microseconds: n, Valid: true}
			}
		}
	}
	return v
}

// keyIDsOf converts a key's values (named, or in key order when names is
// nil) to the key columns kc and returns the identities they may stand
// for.
func (s *Set) keyIDsOf(kc []catalog.ColumnInfo, names []string, vals []any) ([]keyReading, bool) {
	ordered := vals
	if names != nil {
		ordered = make([]any, len(kc))
		for i := range kc {
			found := false
			for j, n := range names {
				if n == kc[i].Name && j < len(vals) {
					ordered[i], found = vals[j], true
				}
			}
			if !found {
				return nil, false
			}
		}
	}
	if len(ordered) != len(kc) {
		return nil, false
	}
	s.kmu.Lock()
	defer s.kmu.Unlock()
	readings := [][]any{nil}
	for i := range kc {
		cands := s.readings(&kc[i], ordered[i])
		if len(cands) == 0 {
			return nil, false
		}
		var next [][]any
		for _, r := range readings {
			for _, c := range cands {
				if len(next) < maxKeyReadings {
					next = append(next, append(append([]any(nil), r...), c))
				}
			}
		}
		readings = next
	}
	out := make([]keyReading, len(readings))
	for i, r := range readings {
		out[i] = keyReading{vals: r, id: plan.KeyID(r)}
	}
	return out, true
}

// readings are the values of column col that v may stand for: v
// converted as an event's value is, or, for a bare number in a time
// column (a key without a schema), each of Debezium's encodings of it.
func (s *Set) readings(col *catalog.ColumnInfo, v any) []any {
	if v == nil {
		return nil
	}
	if n, ok := v.(json.Number); ok {
		if x, err := n.Int64(); err == nil {
			switch col.OID {
			case pgtype.TimestampOID, pgtype.TimestamptzOID:
				var out []any
				for _, t := range []time.Time{time.UnixMilli(x), time.UnixMicro(x), time.Unix(0, x)} {
					t = t.UTC().Truncate(time.Microsecond)
					if col.OID == pgtype.TimestampOID {
						t = time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
					}
					out = append(out, t)
				}
				return out
			case pgtype.TimeOID:
				var out []any
				for _, us := range []int64{x * 1000, x, x / 1000} {
					if us >= 0 && us < 24*int64(time.Hour/time.Microsecond) { // a time of day
						out = append(out, pgtype.Time{Microseconds: us, Valid: true})
					}
				}
				return out
			}
		}
	}
	c, err := s.kconv.Convert(col, v)
	if str, ok := v.(string); ok && err != nil && col.OID == pgtype.NumericOID {
		// Connect's Decimal without its schema: base64 of the unscaled
		// integer, its scale unknown here (the column's numeric has none).
		if b, berr := base64.StdEncoding.DecodeString(str); berr == nil && len(b) > 0 {
			unscaled := new(big.Int).SetBytes(b)
			if b[0]&0x80 != 0 {
				unscaled.Sub(unscaled, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
			}
			var out []any
			for scale := int32(0); scale <= 6; scale++ {
				out = append(out, pgtype.Numeric{Int: unscaled, Exp: -scale, Valid: true})
			}
			return out
		}
	}
	if err != nil || c == nil {
		return nil
	}
	if _, ok := c.(plan.Unavailable); ok {
		return nil
	}
	return []any{c}
}

// keyChangeHeaders are the headers of a primary-key change that name
// another key (Debezium's key-change headers).
var keyChangeHeaders = []string{"__debezium.oldkey", "__debezium.newkey"}

// erasedHeaders returns hs without the key-change headers that name a
// key whose identity erased accepts, and how many it left out.
func (s *Set) erasedHeaders(ctx context.Context, kc []catalog.ColumnInfo, topic string, hs []plan.Header, erased func(rs []keyReading) bool) ([]plan.Header, int) {
	var out []plan.Header
	n := 0
	for i, h := range hs {
		name := strings.ReplaceAll(h.Key, `\0`, "\x00")
		isKey := false
		for _, k := range keyChangeHeaders {
			isKey = isKey || name == k
		}
		if isKey {
			if rs, ok := s.recordKeyIDs(ctx, kc, topic, h.Value, nil); ok && erased(rs) {
				if out == nil {
					out = append(make([]plan.Header, 0, len(hs)), hs[:i]...)
				}
				n++
				continue
			}
		}
		if out != nil {
			out = append(out, h)
		}
	}
	if n == 0 {
		return hs, 0
	}
	return out, n
}
