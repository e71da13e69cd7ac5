package jsonscan

import (
	"bytes"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// jsonText writes a random JSON value in one of the styles found in the
// field: jsonb's own ("a": 1, "b": 2), compact, or spread over lines, with
// keys in any order, now and then a duplicate key or an escape.
type jsonText struct {
	r     *rand.Rand
	style int
}

var jsonStrings = []string{"", "plain", "with space", "<b>&amp;</b>", "é ü 中文 😀", `quote " inside`, `back \ slash`,
	"line\nbreak", "tab\tand\rcr", "bell\b", "feed\f", "nul\x00", "\u2028sep", "del\x7f", "a/b", "\xff\xfe bad utf-8"}

func (g *jsonText) sep(s string) string {
	switch g.style {
	case 0:
		return s + " "
	case 1:
		return s
	}
	return s + "\n\t "
}

func (g *jsonText) str(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '/' && g.r.IntN(2) == 0:
			b.WriteString(`\/`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || (r == 'é' && g.r.IntN(2) == 0) || r == '\u2028':
			fmt.Fprintf(&b, `\u%04x`, r)
		case r == utf8RuneError(s):
			b.WriteString("\xff") // invalid UTF-8, as some sources send it
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func utf8RuneError(s string) rune {
	if strings.Contains(s, "\xff") {
		return '\uFFFD'
	}
	return -1
}

func (g *jsonText) value(depth int) string {
	k := g.r.IntN(10)
	if depth > 3 {
		k = g.r.IntN(6)
	}
	switch k {
	case 0:
		return []string{"true", "false", "null"}[g.r.IntN(3)]
	case 1, 2:
		return []string{"0", "-0", "1.50", "1e5", "1E+5", "-12.3e-4", "123456789012345678901234567890", "7"}[g.r.IntN(8)]
	case 3, 4, 5:
		return g.str(jsonStrings[g.r.IntN(len(jsonStrings))])
	case 6, 7:
		n := g.r.IntN(4)
		parts := make([]string, n)
		for i := range parts {
			parts[i] = g.value(depth + 1)
		}
		return "[" + strings.Join(parts, g.sep(",")) + "]"
	}
	n := g.r.IntN(5)
	keys := []string{"a", "b", "id", "name", "Z", "é", "a<b", "", "k\"q"}
	parts := make([]string, n)
	for i := range parts {
		parts[i] = g.str(keys[g.r.IntN(len(keys))]) + g.sep(":") + g.value(depth+1)
	}
	return "{" + strings.Join(parts, g.sep(",")) + "}"
}

// TestCanonJSONFast: the fast canonical form is byte for byte what
// encoding/json gives, wherever it takes the input; scd_hash depends on it.
func TestCanonJSONFast(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 13))
	fast, total := 0, 0
	check := func(raw string) {
		t.Helper()
		total++
		want := CanonSlow([]byte(raw))
		got, ok := AppendCanon([]byte("prefix"), []byte(raw))
		if !ok {
			if string(got) != "prefix" {
				t.Fatalf("%q: a refusal changed dst to %q", raw, got)
			}
			return
		}
		fast++
		if !bytes.Equal(got[len("prefix"):], want) {
			t.Fatalf("%q:\n fast %s\n want %s", raw, got[len("prefix"):], want)
		}
		if string(Canon([]byte(raw))) != string(want) {
			t.Fatalf("%q: Canon differs from encoding/json's", raw)
		}
	}
	for i := range 30000 {
		g := &jsonText{r: r, style: i % 3}
		check(g.value(0))
	}
	for _, raw := range []string{"", " ", "01", "1.", ".5", "-", "1e", "tru", "nul", `{"a" 1}`, `[1,]`, `{,}`, `{"a":1,}`,
		`[1 2]`, `"open`, `{"a":1} x`, `  {"a": [1, {"b": null}]}  `, strings.Repeat("[", 70) + strings.Repeat("]", 70),
		`{"a":1,"a":2}`, `{"b":1,"a":{"d":[],"c":{}}}`} {
		check(raw)
	}
	// jsonb's own output, the common case, takes the fast path.
	jsonb := `{"id": 7, "tags": ["a", "b"], "name": "Ann <ann@example.com>", "nested": {"z": 1.50, "a": null}}`
	if _, ok := AppendCanon(nil, []byte(jsonb)); !ok {
		t.Fatalf("jsonb's output %s does not take the fast path", jsonb)
	}
	check(jsonb)
	t.Logf("%d of %d inputs took the fast path", fast, total)
	if fast < total/4 {
		t.Fatalf("only %d of %d inputs took the fast path", fast, total)
	}
}

func TestNumericJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 8))
	nums := []pgtype.Numeric{{}, {Valid: true}, {NaN: true, Valid: true}, {InfinityModifier: pgtype.Infinity, Valid: true},
		{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, {Int: big.NewInt(0), Exp: -3, Valid: true}}
	for range 20000 {
		n := big.NewInt(r.Int64N(1 << 62))
		for range r.IntN(3) {
			n.Mul(n, big.NewInt(r.Int64()))
		}
		if r.IntN(2) == 0 {
			n.Neg(n)
		}
		nums = append(nums, pgtype.Numeric{Int: n, Exp: int32(r.IntN(60) - 40), Valid: true})
	}
	for _, n := range nums {
		want, _ := n.MarshalJSON()
		if got := AppendNumeric(nil, n); string(got) != string(want) {
			t.Fatalf("%#v: %s, want %s", n, got, want)
		}
	}
}
