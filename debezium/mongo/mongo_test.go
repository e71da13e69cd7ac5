package mongo

import (
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"testing"
)

// MongoDB numbers: doubles as the shortest digits of their value however
// they were printed (Java's 1.0E-4, 3.0), the bare NaN and infinities of
// the BSON library's strict JSON, decimals with their own scale, integers
// as integers; strings that spell NaN stay strings.
func TestMongoNumbers(t *testing.T) {
	cols, vals, err := Document(`{"_id": 1, "a": NaN, "b": -Infinity, "c": 1.0E-4, "d": 3.0, "e": {"$numberDouble": "1.0E-4"},` +
		` "f": {"$numberDecimal": "1.50"}, "g": "NaN, Infinity", "h": 0.1, "i": {"$numberLong": "7"}, "j": 1e21, "k": [Infinity, "x"]}`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "numeric NaN", "b": "numeric -Infinity", "c": "numeric 0.0001", "d": "numeric 3", "e": "numeric 0.0001",
		"f": "numeric 1.50", "g": "text NaN, Infinity", "h": "numeric 0.1", "i": "bigint 7", "j": "numeric 1000000000000000000000",
		"k": `jsonb [{"$numberDouble": "Infinity"}, "x"]`}
	for i, c := range cols {
		w, ok := want[c.Name]
		if !ok {
			continue
		}
		v := vals[i]
		if dv, ok := v.(driver.Valuer); ok {
			v, _ = dv.Value()
		}
		if raw, ok := v.(json.RawMessage); ok {
			v = string(raw)
		}
		if got := fmt.Sprintf("%s %v", c.PGType, v); got != w {
			t.Errorf("%s: %s, want %s", c.Name, got, w)
		}
		delete(want, c.Name)
	}
	if len(want) > 0 {
		t.Errorf("fields missing: %v", want)
	}
}
