package jsonscan

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// TestForEachMemberMatchesGJSON: over valid objects, with whitespace
// anywhere JSON allows it, escaped keys and every kind of value,
// ForEachMember hands over what gjson's ForEach does: the same keys, and
// values of the same Type, Raw and Str, in the same order; and it stops
// when told to.
func TestForEachMemberMatchesGJSON(t *testing.T) { // and ForEachMemberLazy with Unescaped
	rng := rand.New(rand.NewPCG(7, 8))
	space := func() string { return []string{"", "", " ", "\n\t ", "\r\n"}[rng.IntN(5)] }
	images := []string{`{}`, ` { } `, `{"a":1}`, `{"a":-0.5e+3,"b":true,"c":false,"d":null}`, `{"e\"sc":"v","\u00e9":"\u00e9"}`,
		`{"n":{"x":"}]","y":[1,{"z":"\"{"}]},"m":[]}`, "{\n\t\"a\" :\t12 ,\r\n\"b\": \"x\" }", `[1,2]`, `"s"`, `12`, `null`}
	for range 3000 {
		var b strings.Builder
		b.WriteString(space() + "{" + space())
		for i := range rng.IntN(6) {
			if i > 0 {
				b.WriteString(space() + "," + space())
			}
			b.WriteString([]string{`"k"`, `"key with space"`, `"q\"uote"`, `"\u00e9t\u00e9"`, `"k"`, `"n\\"`}[rng.IntN(6)])
			b.WriteString(space() + ":" + space())
			randomJSON(rng, &b, 0)
		}
		b.WriteString(space() + "}" + space())
		images = append(images, b.String())
	}
	type member struct {
		key      string
		typ      gjson.Type
		raw, str string
	}
	for _, img := range images {
		if !gjson.Valid(img) {
			t.Fatalf("test input is not valid JSON: %s", img)
		}
		var want, got []member
		if res := gjson.Parse(img); res.IsObject() {
			res.ForEach(func(k, v gjson.Result) bool {
				want = append(want, member{k.Str, v.Type, v.Raw, v.Str})
				return true
			})
		}
		ForEachMember(img, func(k string, v gjson.Result) bool {
			got = append(got, member{k, v.Type, v.Raw, v.Str})
			return true
		})
		if len(got) != len(want) {
			t.Fatalf("%s: %d members, gjson %d:\n%+v\n%+v", img, len(got), len(want), got, want)
		}
		var lazy []member
		ForEachMemberLazy(img, func(k string, v gjson.Result) bool {
			v = Unescaped(v)
			lazy = append(lazy, member{k, v.Type, v.Raw, v.Str})
			return true
		})
		if len(lazy) != len(want) {
			t.Fatalf("%s: lazily, %d members, gjson %d", img, len(lazy), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: member %d is %+v, gjson's %+v", img, i, got[i], want[i])
			}
			if lazy[i] != want[i] {
				t.Fatalf("%s: member %d is %+v lazily and unescaped, gjson's %+v", img, i, lazy[i], want[i])
			}
		}
		for range 3 { // cut short: invalid, and no panic
			ForEachMember(img[:rng.IntN(len(img)+1)], func(string, gjson.Result) bool { return true })
		}
		if len(want) > 1 {
			n := 0
			ForEachMember(img, func(string, gjson.Result) bool { n++; return false })
			if n != 1 {
				t.Fatalf("%s: went on after false (%d members)", img, n)
			}
		}
	}
}

// FuzzForEachMember: any input, valid or not, never panics, and valid
// JSON is handed over as gjson hands it.
func FuzzForEachMember(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"b":"x\"y","c":[1,{"d":"}"}]}`, `{"a":`, `{"a":"`, `{"\`, `{"a" 1}`, `{"a":tru`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var got []string
		ForEachMember(s, func(k string, v gjson.Result) bool {
			got = append(got, k, v.Raw, v.Str)
			return true
		})
		if !gjson.Valid(s) || !gjson.Parse(s).IsObject() {
			return
		}
		var want []string
		gjson.Parse(s).ForEach(func(k, v gjson.Result) bool {
			want = append(want, k.Str, v.Raw, v.Str)
			return true
		})
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
			t.Fatalf("%q: %q, gjson %q", s, got, want)
		}
	})
}
