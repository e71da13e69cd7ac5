package pgcodec

import (
	"bytes"
	"context"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/pgtest"
)

// fastValues are decimals and times around the fast paths' edges: zero,
// signs, int64's extremes, scales from -20 to 40, 15 and 16 digits,
// instants before 2000 and with nanoseconds, in other zones.
func fastValues() []any {
	rng := rand.New(rand.NewPCG(7, 17))
	var vs []any
	ints := []int64{0, 1, -1, 9999, 10000, -10001, 123456789, 999_999_999_999_999, 1_000_000_000_000_000, 1_000_000_000_000_001,
		-999_999_999_999_999, math.MaxInt64, math.MinInt64, math.MinInt64 + 1}
	for range 3000 {
		ints = append(ints, rng.Int64N(1<<uint(rng.IntN(62)+1))*int64(1-2*rng.IntN(2)))
	}
	for i, v := range ints {
		for _, exp := range []int32{int32(i%61) - 20, 0, -2, -4, -15, -16, -17, 3} {
			vs = append(vs, pgtype.Numeric{Int: big.NewInt(v), Exp: exp, Valid: true})
		}
	}
	huge, _ := new(big.Int).SetString("123456789012345678901234567890", 10)
	vs = append(vs, pgtype.Numeric{Int: huge, Exp: -3, Valid: true}, pgtype.Numeric{NaN: true, Valid: true},
		pgtype.Numeric{InfinityModifier: pgtype.Infinity, Valid: true}, pgtype.Numeric{})
	zone := time.FixedZone("X", -7*3600-1800)
	for range 3000 {
		t := time.Unix(rng.Int64N(4e9)-2e9, rng.Int64N(1e9))
		if rng.IntN(2) == 0 {
			t = t.In(zone)
		}
		vs = append(vs, t)
	}
	return append(vs, time.Time{}, time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC))
}

// TestFastCodecsMatchPgx encodes every value with the fast codecs and with
// pgx's own: the bytes must be the same.
func TestFastCodecsMatchPgx(t *testing.T) {
	plain, fast := pgtype.NewMap(), pgtype.NewMap()
	fast.RegisterTypes(fastTypes())
	fastPaths := 0
	for _, v := range fastValues() {
		oids := []uint32{pgtype.NumericOID}
		if _, ok := v.(time.Time); ok {
			oids = []uint32{pgtype.TimestamptzOID, pgtype.TimestampOID, pgtype.DateOID}
		}
		for _, oid := range oids {
			want, werr := plain.Encode(oid, pgtype.BinaryFormatCode, v, nil)
			got, gerr := fast.Encode(oid, pgtype.BinaryFormatCode, v, nil)
			if (werr == nil) != (gerr == nil) || !bytes.Equal(want, got) {
				t.Fatalf("%#v as OID %d: pgx gives %x (%v), the fast codec %x (%v)", v, oid, want, werr, got, gerr)
			}
		}
		if n, ok := v.(pgtype.Numeric); ok && n.Valid && n.Int != nil && n.Int.IsInt64() && n.Exp >= -16 {
			fastPaths++
		}
	}
	if fastPaths < 10000 {
		t.Fatalf("only %d values took the fast path", fastPaths)
	}
	// Arrays take the element's codec.
	arr := pgtype.FlatArray[any]{pgtype.Numeric{Int: big.NewInt(-12345), Exp: -2, Valid: true}, nil}
	want, _ := plain.Encode(pgtype.NumericArrayOID, pgtype.BinaryFormatCode, arr, nil)
	got, _ := fast.Encode(pgtype.NumericArrayOID, pgtype.BinaryFormatCode, arr, nil)
	if !bytes.Equal(want, got) {
		t.Fatalf("numeric[]: pgx gives %x, the fast codec %x", want, got)
	}
}

// TestFastCodecsRoundTrip COPYs the values into PostgreSQL with the fast
// codecs and reads them back as text next to the same values bound as text
// by pgx's own codecs.
func TestFastCodecsRoundTrip(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	Register(conn.TypeMap())
	if _, err := conn.Exec(ctx, `CREATE TABLE v (i int, n numeric, t timestamptz, ts timestamp, d date)`); err != nil {
		t.Fatal(err)
	}
	var rows [][]any
	values := fastValues()
	for i, v := range values {
		if i%20 != 0 && i > 30 && i < len(values)-40 {
			continue // a sample: the bytes are compared for all in TestFastCodecsMatchPgx
		}
		if _, ok := v.(time.Time); ok {
			rows = append(rows, []any{i, nil, v, v, v})
		} else {
			rows = append(rows, []any{i, v, nil, nil, nil})
		}
	}
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"v"}, []string{"i", "n", "t", "ts", "d"}, pgx.CopyFromRows(rows)); err != nil {
		t.Fatal(err)
	}
	plain, err := pgx.Connect(ctx, conn.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)
	for _, r := range rows {
		var got, want *string
		if err := conn.QueryRow(ctx, `SELECT coalesce(n::text, t::text || ' ' || ts::text || ' ' || d::text) FROM v WHERE i = $1`, r[0]).Scan(&got); err != nil {
			t.Fatal(err)
		}
		v := r[1]
		if v == nil {
			v = r[2]
		}
		if err := plain.QueryRow(ctx, `SELECT coalesce($1::numeric::text, $2::timestamptz::text || ' ' || $3::timestamp::text || ' ' || $4::date::text)`, r[1], r[2], r[3], r[4]).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if (got == nil) != (want == nil) || (got != nil && *got != *want) {
			t.Fatalf("%#v: stored as %v, pgx's own codec gives %v", v, deref(got), deref(want))
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}
