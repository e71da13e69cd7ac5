package jsonscan

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
		got, gerr := DecodeObject([]byte(img))
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%s: encoding/json says %v, DecodeObject %v", img, werr, gerr)
		}
		if werr == nil && !reflect.DeepEqual(want, got) {
			t.Fatalf("%s:\n encoding/json %#v\n DecodeObject  %#v", img, want, got)
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
// DecodeObject's map holds, the last of repeated members winning; images
// it does not take are left to DecodeObject.
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
	visited := 0
	type kept struct{ got, want map[string]any }
	var keep []kept
	for i, img := range images {
		raw := []byte(img)
		if !Visitable(raw) {
			if m, err := DecodeObject(raw); err == nil && m != nil && json.Valid(raw) && !strings.Contains(img, `\ud`) && !strings.Contains(img, `\uD`) && utf8.ValidString(img) {
				t.Fatalf("%s: an object DecodeObject parses with gjson was not taken", img)
			}
			continue
		}
		visited++
		want, werr := DecodeObject(raw)
		got := map[string]any{}
		gerr := Visit(raw, false, plainBoxer{}, func(name string, v any) error {
			got[name] = v
			return nil
		})
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%s: DecodeObject says %v, Visit %v", img, werr, gerr)
		}
		if werr == nil && !reflect.DeepEqual(want, got) {
			t.Fatalf("%s:\n DecodeObject %#v\n Visit  %#v", img, want, got)
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
	if err := Visit([]byte(`{"a":1,"b":2}`), true, plainBoxer{}, func(string, any) error { n++; return stop }); err != stop || n != 1 {
		t.Fatalf("error %v after %d members", err, n)
	}
}

// plainBoxer boxes each value on its own (change.Boxes takes them from
// slabs; what Visit hands over does not depend on the boxer).
type plainBoxer struct{}

func (plainBoxer) String(s string) any      { return s }
func (plainBoxer) Number(n json.Number) any { return n }
