package debezium

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

// MongoDB change events (docs/sources.md). Debezium's MongoDB connector
// writes a document's images as strings of Extended JSON (the BSON
// library's strict mode: {"$oid": …}, {"$date": ms}, {"$numberLong": "…"},
// {"$numberDecimal": "…"}, {"$binary": …}), and the message key as
// {"id": "<the _id in relaxed Extended JSON>"}. A document becomes a row:
// its top-level fields are columns typed by their values — ObjectId text,
// dates timestamptz, 32- and 64-bit integers bigint, doubles double
// precision, decimals numeric, binary bytea, strings text, booleans
// boolean, nested documents and arrays jsonb (their Extended JSON), a
// field first seen null text — and _id (its value as text: an ObjectId's
// hex, a number's digits, a string itself) is the key.

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
	return v.Raw
}

// mongoKey is the _id of the message key ({"id": "<relaxed JSON>"}, with
// or without the JsonConverter's schema), as text.
func mongoKey(raw []byte) (string, error) {
	k := gjson.ParseBytes(raw)
	if p := k.Get("payload"); p.IsObject() && k.Get("schema").Exists() {
		k = p
	}
	id := k.Get("id")
	if id.Type != gjson.String {
		return "", errors.New(`message key has no "id" string (a MongoDB key is {"id": "<_id as JSON>"})`)
	}
	if !gjson.Valid(id.Str) {
		return id.Str, nil
	}
	return mongoIDText(gjson.Parse(id.Str)), nil
}

// mongoDocument reads a document in Extended JSON into a row schema (its
// fields, in order, _id first) and its typed values.
func mongoDocument(doc string) (*rowSchema, []any, error) {
	if !gjson.Valid(doc) {
		return nil, nil, errors.New("document is not valid JSON")
	}
	d := gjson.Parse(doc)
	if !d.IsObject() {
		return nil, nil, errors.New("document is not a JSON object")
	}
	rs := &rowSchema{byName: map[string]*column{}}
	var vals []any
	var err error
	add := func(name, pgType string, v any) {
		c := &column{name: name, kind: kAny, pgType: pgType}
		rs.cols = append(rs.cols, c)
		rs.byName[name] = c
		rs.names = append(rs.names, name)
		rs.columns = append(rs.columns, change.Column{Name: name, PGType: pgType})
		vals = append(vals, v)
	}
	id := d.Get("_id")
	if !id.Exists() {
		return nil, nil, errors.New("document has no _id")
	}
	add("_id", "text", mongoIDText(id))
	d.ForEach(func(k, v gjson.Result) bool {
		if k.Str == "_id" {
			return true
		}
		if _, dup := rs.byName[k.Str]; dup {
			err = fmt.Errorf("field %s appears twice", k.Str)
			return false
		}
		var pgType string
		var val any
		if pgType, val, err = mongoValue(v); err != nil {
			err = fmt.Errorf("field %s: %w", k.Str, err)
			return false
		}
		add(k.Str, pgType, val)
		return true
	})
	if err != nil {
		return nil, nil, err
	}
	return rs, vals, nil
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
		f, err := strconv.ParseFloat(v.Raw, 64)
		if err != nil {
			return "", nil, fmt.Errorf("%s is not a number", clip(v.Raw))
		}
		return "double precision", f, nil
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
			f, err := strconv.ParseFloat(w.Str, 64) // also "NaN", "Infinity", "-Infinity"
			return "double precision", f, true, err
		}
	case "$numberDecimal":
		if w.Type == gjson.String {
			var num pgtype.Numeric
			if err := num.ScanScientific(w.Str); err != nil { // Decimal128's text: "1.50", "1E+3", "1.0E-7"
				return "", nil, true, fmt.Errorf("decimal %q: %w", clip(w.Str), err)
			}
			return "numeric", num, true, nil
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
