package statecache

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
)

// randomValue returns a value of every type a converted row holds.
func randomValue(r *rand.Rand) any {
	switch r.IntN(23) {
	case 0:
		return nil
	case 1:
		return ""
	case 2:
		return fmt.Sprintf("välue %d\x00%d", r.Int64(), r.IntN(10))
	case 3:
		return r.Int64() - r.Int64()
	case 4:
		return int32(r.Uint32())
	case 5:
		return int16(r.Uint32())
	case 6:
		return r.IntN(2) == 0
	case 7:
		return r.NormFloat64() * 1e9
	case 8:
		return time.Unix(r.Int64N(1<<40)-1<<39, r.Int64N(1e9)).UTC()
	case 9:
		return time.Unix(r.Int64N(1<<34), r.Int64N(1e9)) // time.Local, as time.UnixMilli gives
	case 10:
		if r.IntN(3) == 0 {
			return json.RawMessage(nil)
		}
		return json.RawMessage(fmt.Sprintf(`{"a":%d}`, r.IntN(100)))
	case 11:
		if r.IntN(3) == 0 {
			return []byte(nil)
		}
		b := make([]byte, r.IntN(20))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	case 12:
		n := new(big.Int).Lsh(big.NewInt(r.Int64()), uint(r.IntN(100)))
		if r.IntN(2) == 0 {
			n.Neg(n)
		}
		return pgtype.Numeric{Int: n, Exp: int32(r.IntN(40) - 20), Valid: true}
	case 13:
		return pgtype.Numeric{NaN: true, Valid: true}
	case 14:
		return pgtype.Numeric{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	case 16:
		return float32(r.NormFloat64())
	case 17:
		var id [16]byte
		for i := range id {
			id[i] = byte(r.Uint32())
		}
		return id
	case 18:
		return pgtype.Time{Microseconds: r.Int64N(86_400_000_000), Valid: true}
	case 19:
		return pgtype.Interval{Microseconds: r.Int64() >> 8, Days: int32(r.Uint32()), Months: -int32(r.IntN(100)), Valid: r.IntN(9) > 0}
	case 20:
		return pgtype.Timestamp{InfinityModifier: pgtype.InfinityModifier(r.IntN(3) - 1), Valid: true}
	case 21:
		return pgtype.Timestamptz{Time: time.Unix(r.Int64N(1<<33), 0).UTC(), Valid: true}
	case 22:
		return pgtype.Date{InfinityModifier: pgtype.Infinity, Valid: true}
	default:
		return change.UnavailableValue{}
	}
}

func randomLatest(r *rand.Rand) *fold.Latest {
	opt := func(s string) []byte {
		switch r.IntN(3) {
		case 0:
			return nil
		case 1:
			return []byte{}
		}
		return []byte(s)
	}
	strs := func() []string {
		switch r.IntN(3) {
		case 0:
			return nil
		case 1:
			return []string{}
		}
		return []string{"a", "", "col_" + fmt.Sprint(r.IntN(9))}
	}
	vals := func(n int) []any {
		if n < 0 {
			return nil
		}
		vs := make([]any, n)
		for i := range vs {
			vs[i] = randomValue(r)
		}
		return vs
	}
	l := &fold.Latest{OpenerSaved: r.IntN(2) == 0, SideMaxSeq: change.Seq(opt("side")), PrevAbsent: strs(), PrevKnown: r.IntN(2) == 0}
	if r.IntN(2) == 0 {
		t := time.UnixMilli(r.Int64N(1 << 42))
		l.SideMaxT = &t
	}
	switch r.IntN(3) {
	case 0:
		l.ClosedFrom = time.UnixMilli(r.Int64N(1 << 42))
	case 1:
		l.ClosedFrom = fold.NoneClosed
	}
	if r.IntN(5) == 0 {
		return l
	}
	v := &fold.Version{Key: vals(r.IntN(3)), ID: r.Int64() - r.Int64(), Stored: r.IntN(2) == 0, Seq: change.Seq(opt("seq")),
		Op: change.Op(r.IntN(5)), Hash: opt("hash"), Closed: r.IntN(2) == 0, CloseSeq: change.Seq(opt("close")),
		Row: vals(r.IntN(14) - 1), Unavail: strs(), Absent: strs()}
	for _, t := range []*time.Time{&v.From, &v.Raw, &v.To} {
		if r.IntN(4) > 0 {
			*t = time.UnixMicro(r.Int64N(1 << 52)).UTC()
		}
	}
	switch r.IntN(3) {
	case 0:
		v.OpenAbsent = v.Absent
	case 1:
		v.OpenAbsent = strs()
	}
	l.V = v
	return l
}

// sameValue reports whether a and b are the same Go value: same type, same
// nil-ness, same contents (times with the same location).
func sameValue(a, b any) bool {
	if fmt.Sprintf("%T", a) != fmt.Sprintf("%T", b) {
		return false
	}
	switch x := a.(type) {
	case []byte:
		y := b.([]byte)
		return (x == nil) == (y == nil) && bytes.Equal(x, y)
	case json.RawMessage:
		y := b.(json.RawMessage)
		return (x == nil) == (y == nil) && bytes.Equal(x, y)
	case pgtype.Numeric:
		y := b.(pgtype.Numeric)
		return x.Valid == y.Valid && x.NaN == y.NaN && x.InfinityModifier == y.InfinityModifier && x.Exp == y.Exp &&
			(x.Int == nil) == (y.Int == nil) && (x.Int == nil || x.Int.Cmp(y.Int) == 0)
	case float64:
		return x == b.(float64) || (x != x && b.(float64) != b.(float64))
	case time.Time:
		y := b.(time.Time)
		return x.Equal(y) && x.Location() == y.Location()
	case []any:
		return sameValues(x, b.([]any))
	}
	return a == b
}

func sameValues(a, b []any) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameValue(a[i], b[i]) {
			return false
		}
	}
	return true
}

func sameStrings(a, b []string) bool {
	return (a == nil) == (b == nil) && fmt.Sprint(a) == fmt.Sprint(b)
}

func sameOpt(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

// diffLatest names the first field where a and b differ, or "".
func diffLatest(a, b *fold.Latest) string {
	switch {
	case a.OpenerSaved != b.OpenerSaved:
		return "openerSaved"
	case !sameOpt(a.SideMaxSeq, b.SideMaxSeq):
		return "sideMaxSeq"
	case a.PrevKnown != b.PrevKnown:
		return "prevKnown"
	case !sameValue(a.ClosedFrom, b.ClosedFrom):
		return "closedFrom"
	case !sameStrings(a.PrevAbsent, b.PrevAbsent):
		return "prevAbsent"
	case (a.SideMaxT == nil) != (b.SideMaxT == nil) || a.SideMaxT != nil && !sameValue(*a.SideMaxT, *b.SideMaxT):
		return "sideMaxT"
	case (a.V == nil) != (b.V == nil):
		return "v"
	case a.V == nil:
		return ""
	}
	x, y := a.V, b.V
	switch {
	case !sameValues(x.Key, y.Key):
		return "key"
	case x.ID != y.ID || x.Stored != y.Stored || x.Op != y.Op || x.Closed != y.Closed:
		return "id, stored, op or closed"
	case !sameOpt(x.Seq, y.Seq) || !sameOpt(x.Hash, y.Hash) || !sameOpt(x.CloseSeq, y.CloseSeq):
		return "seq, hash or closeSeq"
	case !sameValue(x.From, y.From) || !sameValue(x.Raw, y.Raw) || !sameValue(x.To, y.To):
		return "from, raw or to"
	case !sameValues(x.Row, y.Row):
		return "row"
	case !sameStrings(x.Unavail, y.Unavail) || !sameStrings(x.Absent, y.Absent) || !sameStrings(x.OpenAbsent, y.OpenAbsent):
		return "unavail, absent or openAbsent"
	}
	return ""
}

func TestPackLatestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 17))
	var boxes change.Boxes // values from slabs, and (odd cases) boxed the ordinary way
	var slabs fold.Mem     // and the structs
	type kept struct{ want, got *fold.Latest }
	var keep []kept
	for i := range 20000 {
		l := randomLatest(r)
		blob, ok := pack(nil, l)
		if !ok {
			t.Fatalf("case %d: no packed form for %+v", i, l)
		}
		bx, mem := &boxes, &slabs
		if i%2 == 1 {
			bx, mem = nil, nil
		}
		got, err := unpack(blob, bx, mem)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if d := diffLatest(l, got); d != "" {
			t.Fatalf("case %d: %s differs:\n%+v\n%+v", i, d, l.V, got.V)
		}
		// Shared bytes are capped: an append to them copies, the blob stays.
		if got.V != nil && got.V.Seq != nil {
			before := string(blob)
			_ = append(got.V.Seq, 0xff, 0xff)
			_ = append(got.V.Hash, 0xff, 0xff)
			if string(blob) != before {
				t.Fatalf("case %d: an append wrote into the packed entry", i)
			}
		}
		// A cut entry is an error, never a panic.
		if _, err := unpack(blob[:r.IntN(len(blob))], bx, mem); err == nil {
			t.Fatalf("case %d: a cut entry unpacked", i)
		}
		if i%50 == 0 {
			keep = append(keep, kept{l, got})
		}
	}
	// Values boxed from slabs survive the collector with nothing else
	// holding their slabs.
	runtime.GC()
	runtime.GC()
	for i, k := range keep {
		if d := diffLatest(k.want, k.got); d != "" {
			t.Fatalf("kept %d: %s differs after a collection", i, d)
		}
	}
}

func TestCacheKeepsUnpackableStates(t *testing.T) {
	zone := time.FixedZone("UTC+2", 7200)
	tests := []struct {
		name string
		l    *fold.Latest
	}{
		{"array value", &fold.Latest{V: &fold.Version{Row: []any{[]any{int64(1)}}}}},
		{"time in a named zone", &fold.Latest{V: &fold.Version{Row: []any{time.Unix(1, 0).In(zone)}}}},
		{"version time in a named zone", &fold.Latest{V: &fold.Version{From: time.Unix(1, 0).In(zone)}}},
		{"an opener", &fold.Latest{V: &fold.Version{Opener: []any{"x"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := pack(nil, tc.l); ok {
				t.Fatal("packed")
			}
			c := New(10, 1<<20)
			k := Key{1, "k"}
			c.Put(k, tc.l)
			got, ok := c.Get(k)
			if !ok {
				t.Fatal("missed")
			}
			if d := diffLatest(tc.l, got); d != "" {
				t.Fatalf("%s differs", d)
			}
		})
	}
	// A state kept unpacked shares nothing with the batch it came from:
	// not the slabs its values were boxed from, not the raw message its
	// strings point into.
	var boxes change.Boxes
	raw := []byte(`"shared text"`)
	text := unsafe.String(&raw[1], 11)
	row := boxes.Anys(3)
	row[0], row[1], row[2] = boxes.String(text), boxes.Int64(1<<40), []any{"array"}
	l := &fold.Latest{V: &fold.Version{Row: row, Hash: boxes.CopyBytes([]byte("digest")), Key: row[:1:1]}}
	c := New(10, 1<<20)
	k := Key{1, "k"}
	c.Put(k, l)
	got, _ := c.Get(k)
	if d := diffLatest(l, got); d != "" {
		t.Fatalf("the kept state's %s differs", d)
	}
	if &got.V.Row[0] == &row[0] || &got.V.Key[0] == &row[0] || &got.V.Hash[0] == &l.V.Hash[0] ||
		unsafe.StringData(got.V.Row[0].(string)) == unsafe.StringData(text) {
		t.Fatal("the kept state shares memory with the batch")
	}
	if (*[2]unsafe.Pointer)(unsafe.Pointer(&got.V.Row[1]))[1] == (*[2]unsafe.Pointer)(unsafe.Pointer(&row[1]))[1] {
		t.Fatal("the kept state's integer is still boxed in the batch's slab")
	}
	// A packed state is unpacked afresh on every hit: changing one does
	// not change the next.
	c = New(10, 1<<20)
	c.Put(k, &fold.Latest{V: &fold.Version{Row: []any{"a", int64(300)}}})
	first, _ := c.Get(k)
	first.V.Row[0] = "changed"
	if second, _ := c.Get(k); second == first || second.V.Row[0] != "a" {
		t.Fatalf("the second hit saw the first one's change: %v", second.V.Row)
	}
}
