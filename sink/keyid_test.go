package sink

import (
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// TestKeyIDMatchesCanon: the key identity built without strings is
// change.KeyID over the values' canon strings, as it was defined.
func TestKeyIDMatchesCanon(t *testing.T) {
	t.Parallel()
	keys := [][]any{
		{int64(7)}, {int64(-1)}, {int64(math.MinInt64)}, {int32(42)}, {int16(-3)}, {"C1"}, {""}, {"a\x00b"},
		{"é" + string(make([]byte, 100))}, {int64(1), "x"}, {"x", int32(1)},
		{pgtype.Numeric{Int: big.NewInt(1250), Exp: -2, Valid: true}}, {time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)},
		{true}, {[]byte{1, 2}}, {int64(5), pgtype.Numeric{Int: big.NewInt(5), Valid: true}},
	}
	for _, key := range keys {
		parts := make([]any, len(key))
		for i, v := range key {
			parts[i] = fold.Canon(v)
		}
		if got, want := plan.KeyID(key), change.KeyID(parts); got != want {
			t.Errorf("%#v: %q, want %q", key, got, want)
		}
	}
}
