package change

import (
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestContentHashValues: the digest of an image kept as values in column
// order is that of the same image as a map, whatever the column order.
func TestContentHashValues(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC)
	cols := []Column{{Name: "zeta"}, {Name: "id"}, {Name: "amount"}, {Name: "tags"}, {Name: "doc"}, {Name: "gone"}, {Name: "b"}}
	vals := []any{"z", int32(7), pgtype.Numeric{Int: big.NewInt(-1250), Exp: -2, Valid: true}, []any{"a", nil, int64(3)},
		json.RawMessage(`{"k":[1,2]}`), nil, []byte{0, 1}}
	m := map[string]any{}
	for i, c := range cols {
		m[c.Name] = vals[i]
	}
	for _, op := range []Op{OpCreate, OpUpdate} {
		if got, want := contentHashValues(op, at, cols, vals), ContentHash(op, at, m); got != want {
			t.Fatalf("op %s: %x, the map's %x", op, got, want)
		}
	}
	vals[0] = "y"
	if contentHashValues(OpCreate, at, cols, vals) == ContentHash(OpCreate, at, m) {
		t.Fatal("a changed value gives the same digest")
	}
}

// TestCanonOfIntegers: integers keep their canonical form (content
// digests stored in scd_hash depend on it).
func TestCanonOfIntegers(t *testing.T) {
	for _, v := range []any{0, 7, int16(-300), int32(123456), int64(-9223372036854775808), int64(9223372036854775807)} {
		var x int64
		switch n := v.(type) {
		case int:
			x = int64(n)
		case int16:
			x = int64(n)
		case int32:
			x = int64(n)
		case int64:
			x = n
		}
		if got, want := string(AppendCanon(nil, v)), string(appendLen(nil, 'D', strconv.FormatInt(x, 10))); got != want {
			t.Errorf("%#v: %q, want %q", v, got, want)
		}
	}
}

// TestCanonOfTimesAndDecimals: times and decimals keep their canonical
// form (content digests stored in scd_hash depend on it).
func TestCanonOfTimesAndDecimals(t *testing.T) {
	zone := time.FixedZone("X", 5*3600+1800)
	for _, v := range []any{time.Date(2026, 3, 1, 12, 0, 0, 5, zone), time.Time{}, time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC),
		pgtype.Numeric{Int: big.NewInt(-1250), Exp: -2, Valid: true}, pgtype.Numeric{Int: big.NewInt(7), Exp: 3, Valid: true},
		pgtype.Numeric{NaN: true, Valid: true}, pgtype.Numeric{InfinityModifier: pgtype.Infinity, Valid: true}, pgtype.Numeric{}} {
		var want string
		if tm, ok := v.(time.Time); ok {
			want = string(appendLen(nil, 'T', tm.UTC().Format(time.RFC3339Nano)))
		} else {
			raw, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			want = string(appendLen(nil, 'J', string(raw)))
		}
		if got := string(AppendCanon(nil, v)); got != want {
			t.Errorf("%#v: %q, want %q", v, got, want)
		}
	}
}

// testRow is a RowDecoder of fixed columns.
type testRow []Column

func (r testRow) Columns() []Column                        { return r }
func (r testRow) DecodeRow([]byte) (map[string]any, error) { return nil, nil }

// TestPackAfterValues: an image packed while it waits is handed over as it
// was, digested as it was, and smaller in the buffer's books.
func TestPackAfterValues(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC)
	cols := testRow{{Name: "id"}, {Name: "name"}, {Name: "amount"}, {Name: "doc"}, {Name: "at"}, {Name: "gone"}, {Name: "b"}, {Name: "tags"}}
	vals := func() []any {
		return []any{int64(1) << 40, "Ann", pgtype.Numeric{Int: big.NewInt(-1250), Exp: -2, Valid: true},
			json.RawMessage(`{"k": [1, 2]}`), at, Unavailable, []byte{0, 1}, []any{"a"}}
	}
	for _, tc := range []struct {
		name   string
		values []any
		packed bool
	}{{"packable", vals()[:7], true}, {"an array stays as it is", vals(), false}} {
		t.Run(tc.name, func(t *testing.T) {
			plain := &Event{Op: OpUpdate, ValidFrom: at, Row: cols[:len(tc.values)], AfterValues: tc.values}
			ev := &Event{Op: OpUpdate, ValidFrom: at, Row: cols[:len(tc.values)], AfterValues: tc.values}
			ev.PackAfterValues()
			if (ev.afterPacked != nil) != tc.packed || (ev.AfterValues == nil) != tc.packed {
				t.Fatalf("packed %v, want %v", ev.afterPacked != nil, tc.packed)
			}
			if ev.Hash() != plain.Hash() {
				t.Fatal("the packed event's digest differs")
			}
			if !ev.CanVisitAfter() {
				t.Fatal("a packed image cannot be visited")
			}
			for _, boxes := range []*Boxes{nil, {}} {
				i := 0
				err := ev.VisitAfter(boxes, func(name string, v any) error {
					if name != cols[i].Name || Canon(v) != Canon(tc.values[i]) || fmt.Sprintf("%T", v) != fmt.Sprintf("%T", tc.values[i]) {
						t.Fatalf("column %d: %s %T %v, want %s %T %v", i, name, v, v, cols[i].Name, tc.values[i], tc.values[i])
					}
					i++
					return nil
				})
				if err != nil || i != len(tc.values) {
					t.Fatalf("visited %d columns: %v", i, err)
				}
			}
			m, err := ev.DecodeAfter()
			if err != nil || len(m) != len(tc.values) {
				t.Fatalf("DecodeAfter: %v %v", m, err)
			}
			if tc.packed && ev.Size() >= plain.Size() {
				t.Fatalf("packed %d bytes, as values %d", ev.Size(), plain.Size())
			}
		})
	}
}
