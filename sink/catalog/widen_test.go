package catalog

import (
	"slices"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
)

// TestHolds: which schema types schema_changes: fail lets a column take
// (DESIGN.md section 11).
func TestHolds(t *testing.T) {
	for _, tc := range []struct {
		col, typ string
		want     bool
	}{
		{"integer", "integer", true},
		{"bigint", "integer", true},  // narrowed, or an older schema
		{"integer", "bigint", false}, // widened
		{"smallint", "integer", false},
		{"text", "text", true},
		{"character varying", "text", true}, // a table created by hand
		{"integer", "text", false},          // incompatible
		{"text", "integer", false},
		{"jsonb", "jsonb", true},
		{"json", "jsonb", true},
		{"timestamp without time zone", "timestamp", true},
		{"timestamp with time zone", "timestamp", true},
		{"date", "timestamp", false},
		{"time without time zone", "time", true},
		{"integer[]", "integer[]", true},
		{"bigint[]", "integer[]", true},
		{"integer[]", "integer", false},
		{"character varying[]", "text[]", true},
		{"text", "", true}, // no type: text
	} {
		t.Run(tc.col+"/"+tc.typ, func(t *testing.T) {
			if got := Holds(tc.col, tc.typ); got != tc.want {
				t.Errorf("holds(%q, %q) = %v, want %v", tc.col, tc.typ, got, tc.want)
			}
		})
	}
}

// TestDropped: a schema lacking a column older than one it has dropped
// it; one lacking only columns added after all of its own is older.
func TestDropped(t *testing.T) {
	tb := &Table{Shape: fold.Shape{Index: map[string]int{}}}
	for i, c := range []ColumnInfo{{Name: "id", Attnum: 1, Key: true}, {Name: "plan", Attnum: 2}, {Name: "city", Attnum: 3}, {Name: "tier", Attnum: 13}} {
		tb.Cols = append(tb.Cols, c)
		tb.Index[c.Name] = i
	}
	schema := func(names ...string) []change.Column {
		var out []change.Column
		for _, n := range names {
			out = append(out, change.Column{Name: n})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		cols []change.Column
		want []string
	}{
		{"all there", schema("id", "plan", "city", "tier"), nil},
		{"an older schema, before tier", schema("id", "plan", "city"), nil},
		{"city dropped", schema("id", "plan", "tier"), []string{"city"}},
		{"city dropped, tier not added yet", schema("id", "plan"), nil},
		{"plan renamed", schema("id", "city", "tier", "tariff"), []string{"plan"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tb.Dropped(tc.cols); !slices.Equal(got, tc.want) {
				t.Errorf("dropped = %v, want %v", got, tc.want)
			}
		})
	}
}
