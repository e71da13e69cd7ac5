package fold

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
)

// Canon renders a typed value so that equal values give equal strings and
// NULL, the empty string and 0 differ.
func Canon(v any) string {
	switch x := v.(type) {
	case pgtype.Numeric:
		if !x.Valid {
			return "N"
		}
		if x.NaN || x.InfinityModifier != pgtype.Finite {
			return fmt.Sprintf("Fnum:%v:%d", x.NaN, x.InfinityModifier)
		}
		r := new(big.Rat).SetInt(x.Int)
		if x.Exp > 0 {
			r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(x.Exp)), nil)))
		} else if x.Exp < 0 {
			r.Quo(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(-x.Exp)), nil)))
		}
		return "D" + r.RatString()
	case change.UnavailableValue:
		return "U"
	case pgtype.InfinityModifier, pgtype.Timestamptz, pgtype.Timestamp, pgtype.Date:
		if c, ok := InfinityCanon(v); ok {
			return c
		}
		switch x := v.(type) {
		case pgtype.Timestamptz:
			return change.Canon(x.Time)
		case pgtype.Timestamp:
			return change.Canon(x.Time)
		case pgtype.Date:
			return change.Canon(x.Time)
		}
		return change.Canon(v)
	case []any:
		b := []byte{'A'}
		for _, e := range x {
			b = append(b, Canon(e)...)
			b = append(b, 0)
		}
		return string(b)
	}
	return change.Canon(v)
}

// ValuesEqual is Canon(a) == Canon(b), with fast paths for the common types.
func ValuesEqual(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case string:
		if y, ok := b.(string); ok {
			return x == y
		}
	case int64:
		if y, ok := b.(int64); ok {
			return x == y
		}
	case int32:
		if y, ok := b.(int32); ok {
			return x == y
		}
	case bool:
		if y, ok := b.(bool); ok {
			return x == y
		}
	case float64:
		if y, ok := b.(float64); ok && x == x && y == y {
			return x == y
		}
	case time.Time:
		if y, ok := b.(time.Time); ok {
			return x.Equal(y)
		}
	case []byte:
		if y, ok := b.([]byte); ok {
			return bytes.Equal(x, y)
		}
	case json.RawMessage:
		if y, ok := b.(json.RawMessage); ok && bytes.Equal(x, y) {
			return true
		}
	case pgtype.Numeric:
		// At one scale the unscaled integers compare; else by value (canon).
		if y, ok := b.(pgtype.Numeric); ok && x.Valid && y.Valid && x.Exp == y.Exp && !x.NaN && !y.NaN &&
			x.InfinityModifier == pgtype.Finite && y.InfinityModifier == pgtype.Finite && x.Int != nil && y.Int != nil {
			return x.Int.Cmp(y.Int) == 0
		}
	}
	if b == nil {
		return false
	}
	return Canon(a) == Canon(b)
}

// RowsEqual reports whether a and b hold equal values at the positions idx.
func RowsEqual(a, b []any, idx []int) bool {
	for _, i := range idx {
		if !ValuesEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// InfinityCanon renders an infinite time value for canon; ok is false for
// finite values.
func InfinityCanon(v any) (string, bool) {
	var im pgtype.InfinityModifier
	switch x := v.(type) {
	case pgtype.InfinityModifier:
		im = x
	case pgtype.Timestamptz:
		im = x.InfinityModifier
	case pgtype.Timestamp:
		im = x.InfinityModifier
	case pgtype.Date:
		im = x.InfinityModifier
	default:
		return "", false
	}
	if im == pgtype.Finite {
		return "", false
	}
	return fmt.Sprintf("Tinf%d", im), true
}
