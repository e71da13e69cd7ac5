package sink

import (
	"math/big"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/sink/fold"
)

func TestValuesEqualNumeric(t *testing.T) {
	t.Parallel()
	num := func(unscaled int64, exp int32) pgtype.Numeric {
		return pgtype.Numeric{Int: big.NewInt(unscaled), Exp: exp, Valid: true}
	}
	tests := []struct {
		name string
		a, b any
		want bool
	}{
		{"same scale, same value", num(110, -2), num(110, -2), true},
		{"same scale, other value", num(110, -2), num(120, -2), false},
		{"other scale, same value", num(110, -2), num(11, -1), true},
		{"other scale, other value", num(110, -2), num(12, -1), false},
		{"null and value", pgtype.Numeric{}, num(0, 0), false},
		{"null and null", pgtype.Numeric{}, pgtype.Numeric{}, true},
		{"NaN and NaN", pgtype.Numeric{NaN: true, Valid: true}, pgtype.Numeric{NaN: true, Valid: true}, true},
		{"NaN and zero", pgtype.Numeric{NaN: true, Valid: true, Exp: 0, Int: big.NewInt(0)}, num(0, 0), false},
		{"infinity and zero", pgtype.Numeric{InfinityModifier: pgtype.Infinity, Valid: true, Int: big.NewInt(0)}, num(0, 0), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := fold.ValuesEqual(tc.a, tc.b); got != tc.want {
				t.Fatalf("valuesEqual(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
			if got := fold.Canon(tc.a) == fold.Canon(tc.b); got != tc.want {
				t.Fatalf("canon disagrees: %v", got)
			}
		})
	}
}
