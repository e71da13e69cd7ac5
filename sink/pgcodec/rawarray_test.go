package pgcodec

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/pgtest"
)

// rawArrayTypes are the element types the tests build arrays of, with
// their array types and each a way to make a value (nil now and then).
var rawArrayTypes = []struct {
	name      string
	elem, arr uint32
	value     func(rng *rand.Rand) any
}{
	{"text", pgtype.TextOID, pgtype.TextArrayOID, func(rng *rand.Rand) any { return strings.Repeat("é\"{,}\\ ", rng.IntN(3)) }},
	{"varchar", pgtype.VarcharOID, pgtype.VarcharArrayOID, func(rng *rand.Rand) any { return strings.Repeat("x", rng.IntN(4)) }},
	{"bpchar", pgtype.BPCharOID, pgtype.BPCharArrayOID, func(rng *rand.Rand) any { return strings.Repeat("y", 1+rng.IntN(3)) }},
	{"bytea", pgtype.ByteaOID, pgtype.ByteaArrayOID, func(rng *rand.Rand) any { return []byte(strings.Repeat("\x00b", rng.IntN(3))) }},
	{"int8", pgtype.Int8OID, pgtype.Int8ArrayOID, func(rng *rand.Rand) any { return rng.Int64() - rng.Int64() }},
	{"int4", pgtype.Int4OID, pgtype.Int4ArrayOID, func(rng *rand.Rand) any { return int32(rng.Uint32()) }},
	{"int2", pgtype.Int2OID, pgtype.Int2ArrayOID, func(rng *rand.Rand) any { return int16(rng.Uint32()) }},
	{"bool", pgtype.BoolOID, pgtype.BoolArrayOID, func(rng *rand.Rand) any { return rng.IntN(2) == 0 }},
	{"float8", pgtype.Float8OID, pgtype.Float8ArrayOID, func(rng *rand.Rand) any { return rng.NormFloat64() * 1e6 }},
	{"timestamptz", pgtype.TimestamptzOID, pgtype.TimestamptzArrayOID, func(rng *rand.Rand) any {
		return time.Unix(rng.Int64N(1<<34), rng.Int64N(1e9)/1000*1000).UTC()
	}},
	{"timestamp", pgtype.TimestampOID, pgtype.TimestampArrayOID, func(rng *rand.Rand) any {
		return time.Unix(rng.Int64N(1<<34), rng.Int64N(1e9)/1000*1000).UTC()
	}},
	{"date", pgtype.DateOID, pgtype.DateArrayOID, func(rng *rand.Rand) any { return time.Unix(rng.Int64N(1<<34), 0).UTC().Truncate(24 * time.Hour) }},
	{"numeric", pgtype.NumericOID, pgtype.NumericArrayOID, func(rng *rand.Rand) any {
		var n pgtype.Numeric
		_ = n.Scan(strings.TrimSuffix(strings.TrimSuffix(time.Duration(rng.Int64N(1e12)).String(), "s"), "m")[:1] + ".25")
		return n
	}},
	{"jsonb", pgtype.JSONBOID, pgtype.JSONBArrayOID, func(rng *rand.Rand) any { return json.RawMessage(`{"a": [1, 2.50], "b": "é"}`) }},
	{"json", pgtype.JSONOID, pgtype.JSONArrayOID, func(rng *rand.Rand) any { return json.RawMessage(`[1, 2.50]`) }},
}

// values are n values of a type, about one in five nil.
func values(rng *rand.Rand, n int, value func(*rand.Rand) any) []any {
	out := make([]any, n)
	for i := range out {
		if rng.IntN(5) != 0 {
			out[i] = value(rng)
		}
	}
	return out
}

// TestRawArrayMatchesPgx: a RawArray is, byte for byte, what pgx sends
// for the same values as an array of the type (its ArrayCodec, element by
// element), NULLs and the empty array included.
func TestRawArrayMatchesPgx(t *testing.T) {
	m := pgtype.NewMap()
	Register(m)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tc := range rawArrayTypes {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []int{0, 1, 2, 7, 300} {
				vals := values(rng, n, tc.value)
				want, err := m.Encode(tc.arr, pgtype.BinaryFormatCode, pgtype.FlatArray[any](vals), nil)
				if err != nil {
					t.Fatalf("pgx: %v", err)
				}
				got, err := NewRawArray(m, tc.elem, n, func(i int) any { return vals[i] })
				if err != nil || !bytes.Equal(got.Bytes(), want) {
					t.Fatalf("%d values: %x (%v), pgx gives %x", n, got, err, want)
				}
				// And pgx sends it as it is, for the array type.
				sent, err := m.Encode(tc.arr, pgtype.BinaryFormatCode, got, nil)
				if err != nil || !bytes.Equal(sent, want) {
					t.Fatalf("%d values sent as %x (%v), want %x", n, sent, err, want)
				}
			}
		})
	}
}

// TestRawArrayRoundTrip: PostgreSQL reads a RawArray as the array pgx
// would have sent, through a prepared statement's cast, and an unnest of
// it gives the values back; a connection without Register refuses it
// (an error, not a wrong value).
func TestRawArrayRoundTrip(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	Register(conn.TypeMap())
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range rawArrayTypes {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []int{0, 1, 50} {
				vals := values(rng, n, tc.value)
				raw, err := NewRawArray(conn.TypeMap(), tc.elem, n, func(i int) any { return vals[i] })
				if err != nil {
					t.Fatal(err)
				}
				var same bool
				var count int
				q := "SELECT ($1::" + tc.name + "[])::text IS NOT DISTINCT FROM ($2::" + tc.name + "[])::text, (SELECT count(*) FROM unnest($1::" + tc.name + "[]))"
				if err := conn.QueryRow(ctx, q, raw, pgtype.FlatArray[any](vals)).Scan(&same, &count); err != nil {
					t.Fatal(err)
				}
				if !same || count != n {
					t.Fatalf("%d values: the same as pgx's %t, %d unnested", n, same, count)
				}
			}
		})
	}
	plain, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plain.Close(ctx) })
	raw, _ := NewRawArray(conn.TypeMap(), pgtype.Int8OID, 1, func(int) any { return int64(1) })
	if err := plain.QueryRow(ctx, "SELECT $1::int8[]", raw).Scan(new(any)); err == nil {
		t.Fatal("a connection without Register took a RawArray")
	}
}

// TestRawArrayFits: the types pgx sends in binary travel as a RawArray,
// those it sends as text (jsonpath, aclitem) and those it does not know
// do not.
func TestRawArrayFits(t *testing.T) {
	m := pgtype.NewMap()
	Register(m)
	for _, tc := range rawArrayTypes {
		if !RawArrayFits(m, tc.elem) {
			t.Errorf("%s does not fit", tc.name)
		}
	}
	for _, oid := range []uint32{pgtype.JSONPathOID, 1033 /* aclitem */, 987654 /* unknown */} {
		if RawArrayFits(m, oid) {
			t.Errorf("OID %d fits", oid)
		}
	}
}
