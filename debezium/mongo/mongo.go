// Package mongo reads what Debezium's MongoDB connector writes
// (docs/sources.md): a document's images as strings of Extended JSON (the
// BSON library's strict mode: {"$oid": …}, {"$date": ms},
// {"$numberLong": "…"}, {"$numberDecimal": "…"}, {"$binary": …}), and the
// message key as {"id": "<the _id in relaxed Extended JSON>"}.
//
// A document becomes a complete row image: its top-level fields are
// columns typed by their values — ObjectId text, dates timestamptz, 32-
// and 64-bit integers bigint, doubles and decimals numeric, binary bytea,
// strings text, booleans boolean, nested documents and arrays jsonb
// (their Extended JSON) — a field it lacks or holds null is null, and _id
// (its value as text: an ObjectId's hex, a number's digits, a string
// itself, other values their canonical JSON) is the key.
//
// Invariants: a document's columns come _id first, then its other fields
// in the order the document has them, each named once; the _id's text is
// the same whether it is read from the document, from the message key or
// from a flattened record's key (IDText), so that every event of a
// document has one key. The package keeps no state: what a document's
// columns and values are depends on that document alone (the parent
// package interns the resulting row schemas per topic).
package mongo

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

// KeyNames name a MongoDB event's key column.
var KeyNames = []string{"_id"}

// IDText is the text of a document id: an ObjectId's hex, a number's
// digits, a string's value, other values their JSON.
func IDText(v gjson.Result) string {
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

// Key is the _id of a message key ({"id": "<relaxed JSON>"}), as text;
// payload is the key's object, without the JsonConverter's schema when it
// has one.
func Key(payload gjson.Result) (string, error) {
	id := payload.Get("id")
	if id.Type != gjson.String {
		return "", errors.New(`message key has no "id" string (a MongoDB key is {"id": "<_id as JSON>"})`)
	}
	return KeyText(id.Str), nil
}

// KeyText is the _id of a key's "id" (the _id in relaxed Extended
// JSON), as text.
func KeyText(id string) string {
	if !gjson.Valid(id) {
		return id
	}
	return IDText(gjson.Parse(id))
}

// Document reads a document in Extended JSON into its columns (its
// fields, in order, _id first) and its typed values. A null field is left
// out: the image is complete (change.Event.Complete), so a field it lacks
// is null, and a null says nothing of the field's type.
func Document(doc string) ([]change.Column, []any, error) {
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
	vals := []any{IDText(id)}
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
		if pgType, val, err = value(v); err != nil {
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
	return cols, vals, nil
}

// value types one Extended JSON value.
func value(v gjson.Result) (string, any, error) {
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
		return double(v.Raw)
	}
	if v.IsObject() {
		var wrapper string
		n := 0
		v.ForEach(func(k, _ gjson.Result) bool { wrapper, n = k.Str, n+1; return true })
		if n == 1 || (n == 2 && v.Get(`\$binary`).Exists()) {
			if n == 2 {
				wrapper = "$binary"
			}
			if t, val, ok, err := wrapped(wrapper, v); ok || err != nil {
				return t, val, err
			}
		}
	}
	return "jsonb", json.RawMessage(v.Raw), nil // a document or an array
}

// numeric reads a double or a Decimal128 as numeric: one type for
// every non-integer number, so that a field's type does not depend on
// which document came first (an integer field widens to numeric, DESIGN
// section 11, when a fraction arrives), and a double keeps the digits it
// prints with ("0.1", not 0.1000000000000000055). Decimal128's text
// ("1.50", "1E+3", "1.0E-7") keeps its scale; NaN and the infinities are
// numeric's own.
func numeric(s string) (string, any, error) {
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

// double reads a double as numeric (numeric) with the digits of
// its shortest round-trip form: the same value whatever the writer printed
// ("1.0E-4" from one JDK, "1.0e-4" from another, "3.0") — 0.0001 and 3,
// not a scale the printing gave it.
func double(s string) (string, any, error) {
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
	return numeric(strconv.FormatFloat(f, 'g', -1, 64))
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

// wrapped reads the Extended JSON wrappers of BSON types; ok is false
// for an object that is none (a nested document).
func wrapped(wrapper string, v gjson.Result) (pgType string, val any, ok bool, err error) {
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
			t, val, err := double(w.Str)
			return t, val, true, err
		}
	case "$numberDecimal":
		if w.Type == gjson.String {
			t, val, err := numeric(w.Str)
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

func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}
