package change

import (
	"encoding/json"
	"math/big"
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
