package change

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"
)

// randomJSON writes a random JSON value: nested objects and arrays,
// numbers of every form, strings with escapes and non-ASCII text.
func randomJSON(rng *rand.Rand, b *strings.Builder, depth int) {
	switch k := rng.IntN(8); {
	case k == 0 && depth < 3:
		b.WriteByte('{')
		for i := range rng.IntN(4) {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(b, "%q:", []string{"a", "b", "é", "a b", `q"`, "a"}[rng.IntN(6)]) // "a" twice: duplicate keys
			randomJSON(rng, b, depth+1)
		}
		b.WriteByte('}')
	case k == 1 && depth < 3:
		b.WriteString("[ ")
		for i := range rng.IntN(4) {
			if i > 0 {
				b.WriteByte(',')
			}
			randomJSON(rng, b, depth+1)
		}
		b.WriteByte(']')
	case k == 2:
		b.WriteString([]string{"0", "-0", "12", "-3.50", "1e3", "1E-7", "123456789012345678901234567890", "0.1e+2"}[rng.IntN(8)])
	case k == 3:
		b.WriteString([]string{"true", "false", "null"}[rng.IntN(3)])
	default:
		b.WriteString([]string{`"plain"`, `""`, `"tab\there"`, `"quote\" and \\ slash\/"`, `"\u00e9\u4e2d"`, `"snow ☃ \ud83d\ude00"`,
			`"nul\u0000byte"`, `"line\nbreak\r"`, `"ü direct"`}[rng.IntN(9)])
	}
}

// TestDecodeObjectMatchesEncodingJSON: schemaless images decode to what
// encoding/json with UseNumber gives, value for value, and fail alike.
func TestDecodeObjectMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	images := []string{`{}`, `null`, `{"a":1,"a":2}`, `{"x":[]}`, `{"x":{}}`, `[1]`, `"s"`, `{"a":}`, `{"a":1`, "{\"bad\":\"\xff\"}",
		`{"lone":"\ud800"}`, `{"pair":"\uD83D\uDE00"}`, ` {"spaced" : [ 1 , 2 ] } `}
	for range 3000 {
		var b strings.Builder
		b.WriteString(`{"k":`)
		randomJSON(rng, &b, 0)
		b.WriteString(`, "id": 7}`)
		images = append(images, b.String())
	}
	fast := 0
	for _, img := range images {
		want, werr := decodeObjectStd([]byte(img))
		got, gerr := decodeObject([]byte(img))
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%s: encoding/json says %v, decodeObject %v", img, werr, gerr)
		}
		if werr == nil && !reflect.DeepEqual(want, got) {
			t.Fatalf("%s:\n encoding/json %#v\n decodeObject  %#v", img, want, got)
		}
		if json.Valid([]byte(img)) && !strings.Contains(img, `\ud`) && !strings.Contains(img, `\uD`) {
			fast++
		}
	}
	if fast < 2000 {
		t.Fatalf("only %d images took the gjson path", fast)
	}
}

// TestVisitObjectMatchesDecodeObject: a schemaless image visited member by
// member (the sink's path, values boxed from slabs) gives what
// decodeObject's map holds, the last of repeated members winning; images
// it does not take are left to decodeObject.
func TestVisitObjectMatchesDecodeObject(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	images := []string{`{}`, `{"a":1,"a":"x"}`, `{"x":[]}`, `{"n":-1.5e3,"b":true,"f":false,"z":null,"s":"q\"\\u00e9"}`,
		` {"spaced" : [ 1 , 2 ] } `, `null`, `[1]`, `"s"`, "{\"bad\":\"\xff\"}", `{"lone":"\ud800"}`, `{"pair":"\uD83D\uDE00"}`}
	for range 3000 {
		var b strings.Builder
		b.WriteString(`{"k":`)
		randomJSON(rng, &b, 0)
		b.WriteString(`, "id": 7, "s": "v\"w", "k2": `)
		randomJSON(rng, &b, 0)
		b.WriteString(`}`)
		images = append(images, b.String())
	}
	var boxes Boxes
	visited := 0
	type kept struct{ got, want map[string]any }
	var keep []kept
	for i, img := range images {
		raw := []byte(img)
		if !visitableObject(raw) {
			if m, err := decodeObject(raw); err == nil && m != nil && json.Valid(raw) && !strings.Contains(img, `\ud`) && !strings.Contains(img, `\uD`) && utf8.ValidString(img) {
				t.Fatalf("%s: an object decodeObject parses with gjson was not taken", img)
			}
			continue
		}
		visited++
		want, werr := decodeObject(raw)
		got := map[string]any{}
		bx := &boxes
		if i%2 == 1 {
			bx = nil
		}
		gerr := visitObject(raw, false, bx, func(name string, v any) error {
			got[name] = v
			return nil
		})
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%s: decodeObject says %v, visitObject %v", img, werr, gerr)
		}
		if werr == nil && !reflect.DeepEqual(want, got) {
			t.Fatalf("%s:\n decodeObject %#v\n visitObject  %#v", img, want, got)
		}
		if i%10 == 0 {
			keep = append(keep, kept{got, want})
		}
	}
	runtime.GC()
	for _, k := range keep {
		if !reflect.DeepEqual(k.got, k.want) {
			t.Fatalf("visited values changed after a collection: %#v, want %#v", k.got, k.want)
		}
	}
	if visited < 2500 {
		t.Fatalf("only %d images visited", visited)
	}
	// A member's error stops the visit and is returned as it is.
	stop := errors.New("stop")
	n := 0
	if err := visitObject([]byte(`{"a":1,"b":2}`), true, nil, func(string, any) error { n++; return stop }); err != stop || n != 1 {
		t.Fatalf("error %v after %d members", err, n)
	}
}

// TestSchemalessVisitNeedsValidJSON: an image not known to be valid is
// checked before it is visited (its names would otherwise be read from
// broken JSON); an invalid one goes the map's way, which rejects it.
func TestSchemalessVisitNeedsValidJSON(t *testing.T) {
	for _, c := range []struct {
		raw   string
		valid bool
		visit bool
	}{
		{`{"a":1}`, false, true},
		{`{"a":1}`, true, true},
		{`{"a":1,"b`, false, false},
		{`{"a" 1}`, false, false},
		{`[1]`, false, false},
	} {
		ev := &Event{Op: OpUpdate, AfterJSON: []byte(c.raw), AfterValid: c.valid}
		if got := ev.CanVisitAfter(); got != c.visit {
			t.Errorf("%s (valid %v): visit %v, want %v", c.raw, c.valid, got, c.visit)
		}
		if !c.visit {
			if _, err := ev.DecodeAfter(); err == nil {
				t.Errorf("%s: decoded without an error", c.raw)
			}
		}
	}
}
