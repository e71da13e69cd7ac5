package change

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/debezium/jsonscan"
)

// KeyID canonically encodes key values.
func KeyID(key []any) string {
	var buf [96]byte // most keys: one allocation, the string
	return string(AppendKeyID(buf[:0], key))
}

// AppendKeyID appends KeyID(key) to b.
func AppendKeyID(b []byte, key []any) []byte {
	for i, v := range key {
		if i > 0 {
			b = append(b, 0)
		}
		b = AppendCanon(b, v)
	}
	return b
}

// ContentHash digests an event's content. Values are encoded with a type tag,
// so NULL, "" and 0 differ, and map keys are sorted.
func ContentHash(op Op, validFrom time.Time, after map[string]any) [16]byte {
	b := make([]byte, 0, 256)
	b = append(b, byte(op))
	b = binary.BigEndian.AppendUint64(b, uint64(validFrom.UnixNano()))
	if after != nil {
		b = AppendCanon(b, after)
	}
	sum := sha256.Sum256(b)
	var out [16]byte
	copy(out[:], sum[:16])
	return out
}

// contentHashValues is ContentHash of the map {cols[i].Name: values[i]}
// (names unique), without building the map.
func contentHashValues(op Op, validFrom time.Time, cols []Column, values []any) [16]byte {
	order := make([]int, len(cols))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(cols[a].Name, cols[b].Name) })
	b := make([]byte, 0, 1024)
	b = append(b, byte(op))
	b = binary.BigEndian.AppendUint64(b, uint64(validFrom.UnixNano()))
	b = append(b, 'M')
	b = strconv.AppendInt(b, int64(len(cols)), 10)
	b = append(b, '{')
	for _, i := range order {
		b = appendLen(b, 'S', cols[i].Name)
		b = AppendCanon(b, values[i])
	}
	b = append(b, '}')
	sum := sha256.Sum256(b)
	var out [16]byte
	copy(out[:], sum[:16])
	return out
}

// RawContentHash digests an event whose row image is raw JSON. Deliveries of
// one Kafka record hash alike; it is not comparable with ContentHash.
func RawContentHash(op Op, validFrom time.Time, after []byte) [16]byte {
	var head [10]byte // streamed: the image is not copied
	head[0], head[1] = byte(op), 'R'
	binary.BigEndian.PutUint64(head[2:], uint64(validFrom.UnixNano()))
	h := sha256.New()
	h.Write(head[:])
	h.Write(after)
	var sum [sha256.Size]byte
	var out [16]byte
	copy(out[:], h.Sum(sum[:0]))
	return out
}

// Canon returns the canonical encoding of one value: a type tag followed by
// an unambiguous rendering. It is what "compares values exactly" means.
func Canon(v any) string { return string(AppendCanon(nil, v)) }

// AppendCanon appends the canonical encoding of v to b.
func AppendCanon(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, 'N')
	case bool:
		if x {
			return append(b, 'B', '1')
		}
		return append(b, 'B', '0')
	case string:
		return appendLen(b, 'S', x)
	case json.Number:
		return appendNumber(b, string(x))
	case int:
		return appendCanonInt(b, int64(x))
	case int16:
		return appendCanonInt(b, int64(x))
	case int32:
		return appendCanonInt(b, int64(x))
	case int64:
		return appendCanonInt(b, x)
	case int8, uint8, uint16, uint32, uint64:
		return appendNumber(b, fmt.Sprint(x))
	case float32:
		return appendFloat(b, float64(x))
	case float64:
		return appendFloat(b, x)
	case time.Time:
		var d [40]byte
		t := x.UTC().AppendFormat(d[:0], time.RFC3339Nano)
		b = append(b, 'T')
		b = strconv.AppendInt(b, int64(len(t)), 10)
		b = append(b, ':')
		return append(b, t...)
	case pgtype.Numeric:
		// What json.Marshal gives (a number or a JSON string, which it
		// would compact as they are), without its reflection.
		var buf [64]byte
		return appendLenBytes(b, 'J', jsonscan.AppendNumeric(buf[:0], x))
	case []byte:
		return appendLen(b, 'X', string(x))
	case json.RawMessage:
		var buf [512]byte
		if out, ok := jsonscan.AppendCanon(buf[:0], x); ok {
			return appendLenBytes(b, 'J', out)
		}
		return appendLen(b, 'J', string(jsonscan.CanonSlow(x)))
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b = append(b, 'M')
		b = strconv.AppendInt(b, int64(len(keys)), 10)
		b = append(b, '{')
		for _, k := range keys {
			b = appendLen(b, 'S', k)
			b = AppendCanon(b, x[k])
		}
		return append(b, '}')
	case []any:
		b = append(b, 'A')
		b = strconv.AppendInt(b, int64(len(x)), 10)
		b = append(b, '[')
		for _, e := range x {
			b = AppendCanon(b, e)
		}
		return append(b, ']')
	case fmt.Stringer:
		return appendLen(b, 'O', x.String())
	default:
		raw, err := json.Marshal(x)
		if err != nil {
			raw = []byte(fmt.Sprintf("%#v", x))
		}
		return appendLen(b, 'J', string(raw))
	}
}

// appendCanonInt is appendLen(b, 'D', the decimal of x), without a string.
func appendCanonInt(b []byte, x int64) []byte {
	var d [20]byte
	digits := strconv.AppendInt(d[:0], x, 10)
	b = append(b, 'D')
	b = strconv.AppendInt(b, int64(len(digits)), 10)
	b = append(b, ':')
	return append(b, digits...)
}

// AppendKeyPart appends one part of a key identity, a canonical encoding
// as bytes: what AppendCanon appends for the same encoding as a string.
func AppendKeyPart(b, canon []byte) []byte {
	b = append(b, 'S')
	b = strconv.AppendInt(b, int64(len(canon)), 10)
	b = append(b, ':')
	return append(b, canon...)
}

func appendLenBytes(b []byte, tag byte, p []byte) []byte {
	b = append(b, tag)
	b = strconv.AppendInt(b, int64(len(p)), 10)
	b = append(b, ':')
	return append(b, p...)
}

func appendLen(b []byte, tag byte, s string) []byte {
	b = append(b, tag)
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// plainInt reports whether s is an integer in its shortest form.
func plainInt(s string) bool {
	if s == "0" {
		return true
	}
	s = strings.TrimPrefix(s, "-")
	if s == "" || s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// appendNumber renders integers and decimals so that 1, 1.0 and 1e0 are equal.
func appendNumber(b []byte, s string) []byte {
	if plainInt(s) {
		return appendLen(b, 'D', s)
	}
	if r, ok := new(big.Rat).SetString(s); ok {
		return appendLen(b, 'D', r.RatString())
	}
	return appendLen(b, 'S', s)
}

func appendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return appendLen(b, 'F', fmt.Sprint(f))
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return appendLen(b, 'D', strconv.FormatInt(int64(f), 10))
	}
	r := new(big.Rat)
	r.SetFloat64(f)
	return appendLen(b, 'D', r.RatString())
}

// CanonJSON renders JSON text canonically, as jsonb compares it: no
// insignificant whitespace, object keys sorted (the last of duplicates
// kept), numbers and strings with their exact value. Invalid JSON is
// returned as it is.
func CanonJSON(raw []byte) []byte {
	return jsonscan.Canon(raw)
}
