package debezium

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

// MongoDB change events (docs/sources.md). Debezium's MongoDB connector
// writes a document's images as strings of Extended JSON (the BSON
// library's strict mode: {"$oid": …}, {"$date": ms}, {"$numberLong": "…"},
// {"$numberDecimal": "…"}, {"$binary": …}), and the message key as
// {"id": "<the _id in relaxed Extended JSON>"}. A document becomes a
// complete row image: its top-level fields are columns typed by their
// values — ObjectId text, dates timestamptz, 32- and 64-bit integers
// bigint, doubles and decimals numeric, binary bytea, strings text,
// booleans boolean, nested documents and arrays jsonb (their Extended
// JSON) — a field it lacks or holds null is null, and _id (its value as
// text: an ObjectId's hex, a number's digits, a string itself, other
// values their canonical JSON) is the key.

// mongoKeyNames name a MongoDB event's key column.
var mongoKeyNames = []string{"_id"}

// isMongo says whether an envelope is the MongoDB connector's.
func isMongo(env *jsonEnvelope) bool {
	return env.get([]string{"source", "connector"}).Str == "mongodb"
}

// mongoIDText is the text of a document id: an ObjectId's hex, a number's
// digits, a string's value, other values their JSON.
func mongoIDText(v gjson.Result) string {
	switch v.Type {
	case gjson.String:
		return v.Str
	case gjson.Number:
		return v.Raw
	}
	if v.IsObject() {
		if oid := v.Get(`\$oid`); oid.Type == gjson.String {
			return oid.Str
		}
		for _, w := range []string{`\$numberLong`, `\$numberInt`} {
			if n := v.Get(w); n.Type == gjson.String {
				return n.Str
			}
		}
	}
	return string(change.CanonJSON([]byte(v.Raw))) // one text however it is spaced
}

// mongoKey is the _id of the message key ({"id": "<relaxed JSON>"}, with
// or without the JsonConverter's schema), as text.
func mongoKey(raw []byte) (string, error) {
	id := keyPayload(raw).Get("id")
	if id.Type != gjson.String {
		return "", errors.New(`message key has no "id" string (a MongoDB key is {"id": "<_id as JSON>"})`)
	}
	return mongoKeyText(id.Str), nil
}

// keyPayload is a JSON message key's object, without the JsonConverter's
// schema when it has one.
func keyPayload(raw []byte) gjson.Result {
	k := gjson.ParseBytes(raw)
	if p := k.Get("payload"); p.IsObject() && k.Get("schema").Exists() {
		return p
	}
	return k
}

// mongoKeyText is the _id of a key's "id" (the _id in relaxed Extended
// JSON), as text.
func mongoKeyText(id string) string {
	if !gjson.Valid(id) {
		return id
	}
	return mongoIDText(gjson.Parse(id))
}

// docSchemas interns the row schemas of documents: documents of one
// collection mostly share their fields, and one schema per field set lets
// the sink note a table's columns once per set, not once per event.
type docSchemas struct {
	mu sync.Mutex
	m  map[string]*rowSchema
}

// maxDocSchemas bounds a topic's interned schemas (a collection whose
// documents all differ starts over when it is reached).
const maxDocSchemas = 256

// get returns the interned schema of the columns (names and types, in
// order), making it if new.
func (d *docSchemas) get(cols []change.Column) *rowSchema {
	n := 0
	for _, c := range cols {
		n += len(c.Name) + len(c.PGType) + 2
	}
	sig := make([]byte, 0, n)
	for _, c := range cols {
		sig = append(append(append(append(sig, c.Name...), 0), c.PGType...), 0)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if rs := d.m[string(sig)]; rs != nil {
		return rs
	}
	if d.m == nil || len(d.m) >= maxDocSchemas {
		d.m = map[string]*rowSchema{}
	}
	rs := &rowSchema{byName: make(map[string]*column, len(cols)), columns: slices.Clone(cols)}
	for _, c := range rs.columns {
		col := &column{name: c.Name, kind: kAny, pgType: c.PGType}
		rs.cols = append(rs.cols, col)
		rs.byName[c.Name] = col
		rs.names = append(rs.names, c.Name)
	}
	d.m[string(sig)] = rs
	return rs
}

// mongoDocument reads a document in Extended JSON into a row schema (its
// fields, in order, _id first) and its typed values. A null field is left
// out: the image is complete (change.Event.Complete), so a field it lacks
// is null, and a null says nothing of the field's type.
func (d *docSchemas) mongoDocument(doc string) (*rowSchema, []any, error) {
	if !gjson.Valid(doc) {
		fixed, ok := wrapBareDoubles(doc)
		if !ok || !gjson.Valid(fixed) {
			return nil, nil, errors.New("document is not valid JSON")
		}
		doc = fixed
	}
	p := gjson.Parse(doc)
	if !p.IsObject() {
		return nil, nil, errors.New("document is not a JSON object")
	}
	id := p.Get("_id")
	if !id.Exists() {
		return nil, nil, errors.New("document has no _id")
	}
	cols := []change.Column{{Name: "_id", PGType: "text"}}
	vals := []any{mongoIDText(id)}
	seen := map[string]bool{"_id": true}
	var err error
	p.ForEach(func(k, v gjson.Result) bool {
		if k.Str == "_id" {
			return true
		}
		if seen[k.Str] {
			err = fmt.Errorf("field %s appears twice", k.Str)
			return false
		}
		seen[k.Str] = true
		if v.Type == gjson.Null {
			return true
		}
		var pgType string
		var val any
		if pgType, val, err = mongoValue(v); err != nil {
			err = fmt.Errorf("field %s: %w", k.Str, err)
			return false
		}
		cols = append(cols, change.Column{Name: k.Str, PGType: pgType})
		vals = append(vals, val)
		return true
	})
	if err != nil {
		return nil, nil, err
	}
	return d.get(cols), vals, nil
}

// mongoValue types one Extended JSON value.
func mongoValue(v gjson.Result) (string, any, error) {
	switch v.Type {
	case gjson.Null:
		return "text", nil, nil
	case gjson.True, gjson.False:
		return "boolean", v.Type == gjson.True, nil
	case gjson.String:
		return "text", v.Str, nil
	case gjson.Number:
		if n, err := strconv.ParseInt(v.Raw, 10, 64); err == nil {
			return "bigint", n, nil
		}
		return mongoDouble(v.Raw)
	}
	if v.IsObject() {
		var wrapper string
		n := 0
		v.ForEach(func(k, _ gjson.Result) bool { wrapper, n = k.Str, n+1; return true })
		if n == 1 || (n == 2 && v.Get(`\$binary`).Exists()) {
			if n == 2 {
				wrapper = "$binary"
			}
			if t, val, ok, err := mongoWrapped(wrapper, v); ok || err != nil {
				return t, val, err
			}
		}
	}
	return "jsonb", json.RawMessage(v.Raw), nil // a document or an array
}

// mongoNumeric reads a double or a Decimal128 as numeric: one type for
// every non-integer number, so that a field's type does not depend on
// which document came first (an integer field widens to numeric, DESIGN
// section 11, when a fraction arrives), and a double keeps the digits it
// prints with ("0.1", not 0.1000000000000000055). Decimal128's text
// ("1.50", "1E+3", "1.0E-7") keeps its scale; NaN and the infinities are
// numeric's own.
func mongoNumeric(s string) (string, any, error) {
	switch s {
	case "NaN", "-NaN":
		return "numeric", pgtype.Numeric{NaN: true, Valid: true}, nil
	case "Infinity", "+Infinity", "inf":
		return "numeric", pgtype.Numeric{InfinityModifier: pgtype.Infinity, Valid: true}, nil
	case "-Infinity", "-inf":
		return "numeric", pgtype.Numeric{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, nil
	}
	var num pgtype.Numeric
	if err := num.ScanScientific(s); err != nil {
		return "", nil, fmt.Errorf("%q is not a number", clip(s))
	}
	return "numeric", num, nil
}

// mongoDouble reads a double as numeric (mongoNumeric) with the digits of
// its shortest round-trip form: the same value whatever the writer printed
// ("1.0E-4" from one JDK, "1.0e-4" from another, "3.0") — 0.0001 and 3,
// not a scale the printing gave it.
func mongoDouble(s string) (string, any, error) {
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return "", nil, fmt.Errorf("%q is not a number", clip(s))
	case math.IsNaN(f):
		return "numeric", pgtype.Numeric{NaN: true, Valid: true}, nil
	case math.IsInf(f, 1): // also a value beyond the range of a double
		return "numeric", pgtype.Numeric{InfinityModifier: pgtype.Infinity, Valid: true}, nil
	case math.IsInf(f, -1):
		return "numeric", pgtype.Numeric{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, nil
	}
	return mongoNumeric(strconv.FormatFloat(f, 'g', -1, 64))
}

// wrapBareDoubles rewrites the bare NaN, Infinity and -Infinity that the
// BSON library's strict JSON mode prints for doubles (not JSON) as
// {"$numberDouble": …}; ok is false when there were none.
func wrapBareDoubles(doc string) (string, bool) {
	var b strings.Builder
	inString, found := false, false
	for i := 0; i < len(doc); i++ {
		c := doc[i]
		switch {
		case inString:
			if c == '\\' && i+1 < len(doc) {
				b.WriteByte(c)
				i++
				c = doc[i]
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		default:
			for _, tok := range []string{"-Infinity", "Infinity", "NaN"} {
				if strings.HasPrefix(doc[i:], tok) {
					b.WriteString(`{"$numberDouble": "` + tok + `"}`)
					i += len(tok) - 1
					found = true
					c = 0
					break
				}
			}
			if c == 0 {
				continue
			}
		}
		b.WriteByte(c)
	}
	return b.String(), found
}

// mongoWrapped reads the Extended JSON wrappers of BSON types; ok is false
// for an object that is none (a nested document).
func mongoWrapped(wrapper string, v gjson.Result) (pgType string, val any, ok bool, err error) {
	w := v.Get(strings.ReplaceAll(wrapper, "$", `\$`))
	switch wrapper {
	case "$oid":
		if w.Type == gjson.String {
			return "text", w.Str, true, nil
		}
	case "$numberLong", "$numberInt":
		if w.Type == gjson.String {
			n, err := strconv.ParseInt(w.Str, 10, 64)
			return "bigint", n, true, err
		}
	case "$numberDouble":
		if w.Type == gjson.String {
			t, val, err := mongoDouble(w.Str)
			return t, val, true, err
		}
	case "$numberDecimal":
		if w.Type == gjson.String {
			t, val, err := mongoNumeric(w.Str)
			return t, val, true, err
		}
	case "$date":
		switch {
		case w.Type == gjson.Number: // strict: milliseconds
			ms, err := strconv.ParseInt(w.Raw, 10, 64)
			return "timestamp with time zone", time.UnixMilli(ms).UTC(), true, err
		case w.IsObject() && w.Get(`\$numberLong`).Type == gjson.String: // canonical
			ms, err := strconv.ParseInt(w.Get(`\$numberLong`).Str, 10, 64)
			return "timestamp with time zone", time.UnixMilli(ms).UTC(), true, err
		case w.Type == gjson.String: // relaxed: ISO 8601
			t, err := time.Parse(time.RFC3339Nano, w.Str)
			return "timestamp with time zone", t.UTC(), true, err
		}
	case "$binary":
		b64 := w.Str
		if w.IsObject() { // canonical: {"base64": …, "subType": …}
			b64 = w.Get("base64").Str
		}
		raw, err := base64.StdEncoding.DecodeString(b64)
		return "bytea", raw, true, err
	}
	return "", nil, false, nil
}
