package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// DecodeObject decodes a schemaless row image as encoding/json does into a
// map with UseNumber: numbers as json.Number, objects as map[string]any,
// arrays as []any. It parses with gjson, without reflection; images where
// the two could differ (invalid UTF-8, escaped surrogates) take
// encoding/json itself (TestDecodeObjectMatchesEncodingJSON).
func DecodeObject(raw []byte) (map[string]any, error) {
	s := string(raw) // one copy: the strings below share it
	if !utf8.ValidString(s) || strings.Contains(s, `\ud`) || strings.Contains(s, `\uD`) {
		return decodeObjectStd(raw)
	}
	if !gjson.Valid(s) {
		return nil, errors.New("row image is not a JSON object: invalid JSON")
	}
	res := gjson.Parse(s)
	switch {
	case res.Type == gjson.Null:
		return nil, nil // as encoding/json leaves the map
	case !res.IsObject():
		return nil, fmt.Errorf("row image is not a JSON object: %s", res.Type)
	}
	return objectOf(res), nil
}

func objectOf(res gjson.Result) map[string]any {
	m := map[string]any{}
	res.ForEach(func(k, v gjson.Result) bool {
		m[k.Str] = valueOf(v)
		return true
	})
	return m
}

func valueOf(v gjson.Result) any {
	switch v.Type {
	case gjson.Null:
		return nil
	case gjson.True:
		return true
	case gjson.False:
		return false
	case gjson.Number:
		return json.Number(v.Raw)
	case gjson.String:
		return v.Str
	}
	if v.IsArray() {
		out := []any{}
		v.ForEach(func(_, e gjson.Result) bool {
			out = append(out, valueOf(e))
			return true
		})
		return out
	}
	return objectOf(v)
}

// Boxer boxes scalars for Visit (change.Boxes: from slabs, not one
// allocation each).
type Boxer interface {
	String(s string) any
	Number(n json.Number) any
}

// Visitable reports whether Visit takes a schemaless image:
// a JSON object (by its first byte) that DecodeObject would parse with
// gjson, not hand to encoding/json.
func Visitable(raw []byte) bool {
	s := strings.TrimLeft(unsafe.String(unsafe.SliceData(raw), len(raw)), " \t\r\n")
	return len(s) > 0 && s[0] == '{' && utf8.Valid(raw) && !bytes.Contains(raw, []byte(`\ud`)) && !bytes.Contains(raw, []byte(`\uD`))
}

// Visit hands a schemaless image's members to fn in their order,
// with the values DecodeObject gives them (a repeated member is handed
// each time: the last one is the map's), scalars boxed from boxes. The
// strings share raw, which nobody writes to. The image must be
// Visitable.
func Visit(raw []byte, valid bool, boxes Boxer, fn func(name string, v any) error) error {
	s := unsafe.String(unsafe.SliceData(raw), len(raw))
	if !valid && !gjson.Valid(s) {
		return errors.New("row image is not a JSON object: invalid JSON")
	}
	var err error
	ForEachMember(s, func(k string, v gjson.Result) bool {
		var val any
		switch v.Type {
		case gjson.Null:
		case gjson.True:
			val = true
		case gjson.False:
			val = false
		case gjson.Number:
			val = boxes.Number(json.Number(v.Raw))
		case gjson.String:
			val = boxes.String(v.Str)
		default:
			val = valueOf(v)
		}
		err = fn(k, val)
		return err == nil
	})
	return err
}

// VisitNames hands a schemaless image's member names to fn (see
// Visit).
func VisitNames(raw []byte, fn func(name string) bool) {
	ForEachMember(unsafe.String(unsafe.SliceData(raw), len(raw)), func(k string, _ gjson.Result) bool { return fn(k) })
}

// decodeObjectStd is encoding/json's decoding with UseNumber.
func decodeObjectStd(raw []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("row image is not a JSON object: %w", err)
	}
	return m, nil
}
