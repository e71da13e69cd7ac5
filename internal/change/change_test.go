package change

import (
	"encoding/json"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

func TestSeqOrdersLikeItsComponents(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randPart := func() any {
		switch rng.IntN(5) {
		case 0:
			return int64(rng.IntN(2000) - 1000)
		case 1:
			return json.Number(strconv.Itoa(rng.IntN(1 << 30)))
		case 2:
			return strconv.Itoa(rng.IntN(300)) // digits compare numerically
		case 3:
			return []string{"a", "ab", "b", "a\x00b", ""}[rng.IntN(5)]
		default:
			return new(big.Int).Lsh(big.NewInt(int64(rng.IntN(100))), 70).String()
		}
	}
	cmpPart := func(a, b any) int {
		num := func(x any) (*big.Int, bool) {
			switch v := x.(type) {
			case int64:
				return big.NewInt(v), true
			case json.Number:
				n, ok := new(big.Int).SetString(string(v), 10)
				return n, ok
			case string:
				n, ok := new(big.Int).SetString(v, 10)
				return n, ok
			}
			return nil, false
		}
		na, oka := num(a)
		nb, okb := num(b)
		switch {
		case oka && okb:
			return na.Cmp(nb)
		case oka:
			return -1
		case okb:
			return 1
		}
		sa, sb := a.(string), b.(string)
		switch {
		case sa < sb:
			return -1
		case sa > sb:
			return 1
		}
		return 0
	}
	for i := 0; i < 20000; i++ {
		n, m := 1+rng.IntN(3), 1+rng.IntN(3)
		a, b := make([]any, n), make([]any, m)
		for j := range a {
			a[j] = randPart()
		}
		for j := range b {
			b[j] = randPart()
		}
		want := 0
		for j := 0; j < n && j < m && want == 0; j++ {
			want = cmpPart(a[j], b[j])
		}
		if want == 0 {
			want = map[bool]int{true: -1, false: 1}[n < m]
			if n == m {
				want = 0
			}
		}
		if got := MustSeq(a...).Compare(MustSeq(b...)); got != want {
			t.Fatalf("%v vs %v: Compare %d, want %d", a, b, got, want)
		}
	}
}

func TestSeqOf(t *testing.T) {
	tests := []struct {
		name    string
		parts   []any
		want    string
		wantErr bool
	}{
		{"lsn", []any{json.Number("24023928")}, "[24023928]", false},
		{"debezium source.sequence", []any{`["24023928","24023960"]`, json.Number("24023960")}, "[24023928,24023960,24023960]", false},
		{"mysql binlog", []any{"mysql-bin.000003", json.Number("154"), json.Number("0")}, `["mysql-bin.000003",154,0]`, false},
		{"null", []any{nil}, "", true},
		{"boolean", []any{true}, "", true},
		{"empty", nil, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := SeqOf(tc.parts...)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil && s.String() != tc.want {
				t.Fatalf("got %s, want %s", s, tc.want)
			}
		})
	}
}

func TestCanonAndHash(t *testing.T) {
	distinct := []any{nil, "", json.Number("0"), "0", false, []byte{}, map[string]any{}, []any{}}
	seen := map[string]any{}
	for _, v := range distinct {
		c := Canon(v)
		if prev, ok := seen[c]; ok {
			t.Fatalf("%#v and %#v encode alike", prev, v)
		}
		seen[c] = v
	}
	equal := [][2]any{{json.Number("1"), json.Number("1.0")}, {int64(5), json.Number("5")}, {1.5, json.Number("1.50")},
		{map[string]any{"a": 1, "b": "x"}, map[string]any{"b": "x", "a": 1}}}
	for _, p := range equal {
		if Canon(p[0]) != Canon(p[1]) {
			t.Errorf("%#v and %#v should encode alike", p[0], p[1])
		}
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := ContentHash(OpUpdate, at, map[string]any{"x": "a|b", "y": "c"})
	b := ContentHash(OpUpdate, at, map[string]any{"x": "a", "y": "b|c"})
	if a == b {
		t.Fatal("values with a delimiter inside hash alike")
	}
	if ContentHash(OpUpdate, at, nil) == ContentHash(OpCreate, at, nil) {
		t.Fatal("operation not in the hash")
	}
}

func TestAppendSeqMatchesSeqOf(t *testing.T) {
	for _, n := range []int64{0, 1, -1, 255, 256, -256, 24023984, 1 << 62, -(1 << 62), math.MaxInt64, math.MinInt64} {
		if got, want := Seq(AppendSeqInt(nil, n)), MustSeq(n); got.Compare(want) != 0 {
			t.Errorf("AppendSeqInt(%d) = %x, SeqOf gives %x", n, got, want)
		}
		s := strconv.FormatInt(n, 10)
		if got, want := Seq(AppendSeqText(nil, s)), MustSeq(s); got.Compare(want) != 0 {
			t.Errorf("AppendSeqText(%q) = %x, SeqOf gives %x", s, got, want)
		}
	}
	for _, s := range []string{"mysql-bin.000003", "00000027:00000758:0003", "123456789012345678901234", "-0", "+5", "", "1e3"} {
		if got, want := Seq(AppendSeqText(nil, s)), Seq(appendNumeric(nil, s)); got.Compare(want) != 0 {
			t.Errorf("AppendSeqText(%q) = %x, want %x", s, got, want)
		}
	}
	// A null inside source.sequence sorts before any LSN.
	first, later := MustSeq(`[null,"100"]`), MustSeq(`["90","100"]`)
	if first.Compare(later) >= 0 || first.String() != "[null,100]" {
		t.Errorf("null component: %s vs %s", first, later)
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
