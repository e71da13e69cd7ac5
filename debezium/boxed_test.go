package debezium

import (
	"encoding/base64"
	"fmt"
	"math/big"
	"math/rand/v2"
	"reflect"
	"runtime"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

// TestBoxedValueMatchesValue: decoding into slabs (the path a batch's rows
// take) gives exactly what value gives, errors included.
func TestBoxedValueMatchesValue(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	b64 := func(n *big.Int, width int) string {
		// big-endian two's complement, as Kafka Connect writes decimals
		m := new(big.Int).Set(n)
		if m.Sign() < 0 {
			m.Add(m, new(big.Int).Lsh(big.NewInt(1), uint(8*width)))
		}
		b := m.FillBytes(make([]byte, width))
		return base64.StdEncoding.EncodeToString(b)
	}
	quote := func(s string) string { return fmt.Sprintf("%q", s) }
	inputs := map[kind][]string{
		kString:         {`"plain"`, `"esc\"aped\u00e9"`, `""`, quote(change.Unavailable), `12`, `null`},
		kInt64:          {`0`, `255`, `256`, `-1`, `9223372036854775807`, `-9223372036854775808`, `1.5`, `"7"`, `null`},
		kInt32:          {`0`, `2147483647`, `2147483648`, `-2147483649`, `-5`, `"x"`},
		kInt16:          {`0`, `255`, `256`, `32767`, `32768`, `-32768`, `-32769`, `-5`, `"x"`, `1.5`},
		kDate:           {`0`, `19000`, `-719162`, `2932896`, `"x"`, quote(change.Unavailable)},
		kTimestampMilli: {`0`, `1700000000123`, `9223372036825200000`, `-9223372036832400000`, `-62135596800000`},
		kTimestampMicro: {`1700000000123456`, `-1`, `9223372036825200000`},
		kTimestampNano:  {`1700000000123456789`, `-9223372036832400001`},
		kZonedTimestamp: {`"2024-05-01T10:11:12.123456Z"`, `"2024-05-01T10:11:12+02:00"`, `"infinity"`, `"-infinity"`, `"+infinity"`, `"2024-13-01T00:00:00Z"`, `5`},
		kJSON:           {`"{\"a\":[1,2]}"`, `"{}"`, `"not json"`, `"\"s\""`, `7`, `null`},
		kDecimal:        {`""`, `"AA=="`, `"/w=="`, `"gA=="`, `"gAAA"`, `"//8="`, `"AP8="`, `"/wAA"`, `"not base64"`, quote(change.Unavailable), `12`},
	}
	edge := new(big.Int).Lsh(big.NewInt(1), 191) // -2^191: the widest two's complement that fits 24 bytes
	inputs[kDecimal] = append(inputs[kDecimal], quote(b64(new(big.Int).Neg(edge), 24)), quote(b64(new(big.Int).Sub(edge, big.NewInt(1)), 24)))
	for range 300 {
		n := new(big.Int)
		for range r.IntN(4) {
			n.Lsh(n, 62).Add(n, big.NewInt(r.Int64N(1<<62)))
		}
		if r.IntN(3) == 0 {
			n.Neg(n)
		}
		width := (n.BitLen()+8)/8 + r.IntN(3)
		inputs[kDecimal] = append(inputs[kDecimal], quote(b64(n, width)))
	}
	boxes := &change.Boxes{}
	type kept struct {
		want, got any
	}
	var keep []kept
	for k, raws := range inputs {
		c := &column{name: "c", kind: k, pgType: "t", scale: int32(r.IntN(5))}
		for _, raw := range raws {
			v := gjson.Parse(raw)
			want, werr := c.value(v)
			got, gerr := c.boxedValue(v, boxes)
			if fmt.Sprint(werr) != fmt.Sprint(gerr) {
				t.Fatalf("kind %d, %s: error %v, want %v", k, raw, gerr, werr)
			}
			if !sameDecoded(got, want) {
				t.Fatalf("kind %d, %s: %#v, want %#v", k, raw, got, want)
			}
			keep = append(keep, kept{want, got})
		}
	}
	runtime.GC()
	for i, k := range keep {
		if !sameDecoded(k.got, k.want) {
			t.Fatalf("value %d changed after a collection: %#v, want %#v", i, k.got, k.want)
		}
	}
}

func sameDecoded(a, b any) bool {
	if reflect.TypeOf(a) != reflect.TypeOf(b) {
		return false
	}
	if x, ok := a.(pgtype.Numeric); ok {
		y := b.(pgtype.Numeric)
		return x.Exp == y.Exp && x.Valid == y.Valid && x.NaN == y.NaN && (x.Int == nil) == (y.Int == nil) && (x.Int == nil || x.Int.Cmp(y.Int) == 0)
	}
	return reflect.DeepEqual(a, b)
}
