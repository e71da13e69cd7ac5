package change

import (
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

func TestBoxes(t *testing.T) {
	num := func(i int) pgtype.Numeric {
		return pgtype.Numeric{Int: big.NewInt(int64(i) * 1e15), Exp: -2, Valid: true}
	}
	values := func(i int) []any {
		return []any{
			fmt.Sprintf("value %d", i), "", int64(i) * 1e9, int64(i % 200), int64(-i), int32(i * 1000), int32(-i), int16(i * 7), int16(-i),
			time.Unix(int64(i)*1e6, int64(i)).UTC(), time.UnixMilli(int64(i)), num(i),
			json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), []byte{byte(i), 1}, []byte(nil),
		}
	}
	box := func(b *Boxes, v any) any {
		switch x := v.(type) {
		case string:
			return b.String(x)
		case int64:
			return b.Int64(x)
		case int32:
			return b.Int32(x)
		case int16:
			return b.Int16(x)
		case time.Time:
			return b.Time(x)
		case pgtype.Numeric:
			n := x
			n.Int = b.BigInt(len(x.Int.Bits())).Set(x.Int)
			return b.Numeric(n)
		case json.RawMessage:
			return b.JSON(b.Copy(string(x)))
		case []byte:
			return b.Bytes(x)
		}
		panic(fmt.Sprintf("%T", v))
	}
	for _, tc := range []struct {
		name  string
		boxes *Boxes
	}{{"slabs", &Boxes{}}, {"nil boxes", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			var got [][]any
			for i := range 2000 { // several slabs of each type
				row := values(i)
				for j, v := range row {
					row[j] = box(tc.boxes, v)
				}
				got = append(got, row)
			}
			runtime.GC() // the slabs are held only through the interfaces
			runtime.GC()
			for i, row := range got {
				want := values(i)
				for j := range row {
					if reflect.TypeOf(row[j]) != reflect.TypeOf(want[j]) {
						t.Fatalf("row %d value %d: %T, want %T", i, j, row[j], want[j])
					}
					switch w := want[j].(type) {
					case pgtype.Numeric:
						g := row[j].(pgtype.Numeric)
						if g.Int.Cmp(w.Int) != 0 || g.Exp != w.Exp || !g.Valid {
							t.Fatalf("row %d value %d: %v, want %v", i, j, g, w)
						}
					case []byte, json.RawMessage:
						if !reflect.DeepEqual(row[j], w) {
							t.Fatalf("row %d value %d: %v, want %v", i, j, row[j], w)
						}
					default:
						if row[j] != w { // interfaces compare by value
							t.Fatalf("row %d value %d: %v, want %v", i, j, row[j], w)
						}
					}
				}
			}
		})
	}
}

func TestBoxesAllocateBySlab(t *testing.T) {
	var b Boxes
	strs := make([]string, 1000)
	for i := range strs {
		strs[i] = fmt.Sprint("s", i)
	}
	out := make([]any, 0, 4000)
	allocs := testing.AllocsPerRun(10, func() {
		out = out[:0]
		for i, s := range strs {
			out = append(out, b.String(s), b.Int64(int64(i)*1000), b.Time(time.Unix(int64(i), 0)))
		}
	})
	if allocs > 20 { // 3,000 values: a dozen slabs; boxed one by one, 3,000 allocations
		t.Fatalf("%.0f allocations for 3,000 values", allocs)
	}
}

func TestBoxesSlicesAreCapped(t *testing.T) {
	var b Boxes
	x, y := b.Copy("abc"), b.CopyBytes([]byte("def"))
	_ = append(x, 'Z')
	if string(y) != "def" || string(x) != "abc" {
		t.Fatalf("an append to one copy wrote into the next: %q %q", x, y)
	}
	r1, r2 := b.Anys(2), b.Anys(2)
	r2[0], r2[1] = "a", "b"
	_ = append(r1, "Z")
	if len(r1) != 2 || r1[0] != nil || r2[0] != "a" || r2[1] != "b" {
		t.Fatalf("an append to one row wrote into the next: %v %v", r1, r2)
	}
	if big := b.Anys(1000); len(big) != 1000 {
		t.Fatalf("Anys(1000) has %d values", len(big))
	}
}
