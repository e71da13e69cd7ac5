package pgcodec

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/pgtest"
)

// TestCopyValueMatchesPgx: the values AppendCopyValue encodes itself get
// the bytes pgx's codecs give them, length included; nil and typed nils
// are NULL.
func TestCopyValueMatchesPgx(t *testing.T) {
	m := pgtype.NewMap()
	Register(m)
	rng := rand.New(rand.NewPCG(1, 2))
	zones := []*time.Location{time.UTC, time.FixedZone("x", -7*3600-1800), time.Local}
	var values []any
	for range 2000 {
		values = append(values, rng.Int64()-rng.Int64(), int32(rng.Uint32()), int16(rng.Uint32()), rng.IntN(2) == 0,
			rng.NormFloat64()*1e6, strings.Repeat("é", rng.IntN(5)), []byte(strings.Repeat("b", rng.IntN(3))),
			time.Unix(rng.Int64N(1<<36)-1<<35, rng.Int64N(1e9)).In(zones[rng.IntN(3)]))
	}
	values = append(values, nil, []byte(nil), math.Inf(1), math.NaN(), "", time.Time{}, int64(math.MinInt64),
		json.RawMessage(nil), json.RawMessage(`{"a": [1, 2.50], "b": "é"}`), json.RawMessage(`null`), json.RawMessage(``))
	values = append(values, fastValues()...) // decimals of every shape, on the fast codec's path and off it
	oids := []uint32{pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID, pgtype.ByteaOID, pgtype.Int8OID, pgtype.Int4OID,
		pgtype.Int2OID, pgtype.BoolOID, pgtype.Float8OID, pgtype.TimestamptzOID, pgtype.TimestampOID, pgtype.DateOID,
		pgtype.NumericOID, pgtype.JSONOID, pgtype.JSONBOID}
	for _, v := range values {
		for _, oid := range oids {
			// As pgx's CopyFrom: the length is written over -1 unless
			// the value encodes as NULL (nil).
			want, err := m.Encode(oid, pgtype.BinaryFormatCode, v, binary.BigEndian.AppendUint32(make([]byte, 0, 64), math.MaxUint32))
			if err != nil {
				continue // not a pair pgx encodes: covered against a server below
			}
			if want == nil {
				want = binary.BigEndian.AppendUint32(nil, math.MaxUint32)
			} else {
				binary.BigEndian.PutUint32(want, uint32(len(want)-4))
			}
			got, err := AppendCopyValue(m, nil, oid, v)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%#v as OID %d: %x (%v), pgx gives %x", v, oid, got, err, want)
			}
		}
	}
}

// TestCopyInMatchesCopyFrom COPYs the same rows with CopyIn and with
// pgx's CopyFrom into tables of every common type, in the Go types the
// sink holds and as strings (pgx's fallback: scanned as the column's
// type), and finds the tables equal; a value neither can encode fails
// both.
func TestCopyInMatchesCopyFrom(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	Register(conn.TypeMap())
	const ddl = `(id int8, tx text, vc varchar(12), i2 int2, i4 int4, i8 int8, b bool, f8 float8, f4 real, n numeric, tz timestamptz,
		ts timestamp, d date, by bytea, js json, jb jsonb, u uuid, arr text[], ia int4[], tm time, iv interval)`
	cols := []string{"id", "tx", "vc", "i2", "i4", "i8", "b", "f8", "f4", "n", "tz", "ts", "d", "by", "js", "jb", "u", "arr", "ia", "tm", "iv"}
	for _, name := range []string{"a", "b"} {
		if _, err := conn.Exec(ctx, "CREATE TABLE "+name+" "+ddl); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	at := time.Date(2026, 3, 4, 5, 6, 7, 891234000, time.FixedZone("y", 3600))
	typed := func(i int) []any {
		return []any{int64(i), "text é " + strings.Repeat("x", i%7), "vc", int16(i), int32(-i), int64(i) << 40, i%2 == 0, float64(i) / 3, float32(i) / 7,
			pgtype.Numeric{Int: big.NewInt(int64(i*1234567 - 99)), Exp: -3, Valid: true}, at.Add(time.Duration(i) * time.Hour), at.UTC(), at,
			[]byte{byte(i), 0, 255}, json.RawMessage(`{"a": [1, 2.50]}`), json.RawMessage(`{"b":true}`), [16]byte{byte(i), 1, 2},
			[]string{"x", "y z"}, []int32{int32(i), 7}, pgtype.Time{Microseconds: int64(i) * 1e6, Valid: true},
			pgtype.Interval{Months: 1, Days: int32(i), Microseconds: 5, Valid: true}}
	}
	texts := func(i int) []any {
		return []any{int64(i), "t", "v", "12", "-7", "9000000000", "true", "1.5", "2.25", "12.50", "2024-01-02 03:04:05+02", "2024-01-02 03:04:05",
			"2024-01-02", []byte(nil), json.RawMessage(nil), `{"c": null}`, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "{a,\"b c\"}", "{1,NULL}", "12:34:56.5", "3 days 04:05:06"}
	}
	nulls := func(i int) []any {
		r := make([]any, len(cols))
		r[0] = int64(i)
		return r
	}
	var rows [][]any
	for i := range 300 {
		switch rng.IntN(3) {
		case 0:
			rows = append(rows, typed(i))
		case 1:
			rows = append(rows, texts(i))
		default:
			rows = append(rows, nulls(i))
		}
	}
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"a"}, cols, pgx.CopyFromRows(rows)); err != nil {
		t.Fatal(err)
	}
	copyB := func(rows [][]any) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		n, err := CopyIn(ctx, tx, pgx.Identifier{"b"}, cols, nil, len(rows), func(i int, row []any) []any { return append(row, rows[i]...) })
		if err != nil {
			return err
		}
		if n != int64(len(rows)) {
			t.Fatalf("copyIn wrote %d rows of %d", n, len(rows))
		}
		return tx.Commit(ctx)
	}
	if err := copyB(rows); err != nil {
		t.Fatal(err)
	}
	dump := func(table string) string {
		var s string
		if err := conn.QueryRow(ctx, `SELECT string_agg(x::text, E'\n' ORDER BY id) FROM `+table+` x`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if a, b := dump("a"), dump("b"); a != b {
		t.Fatalf("the tables differ:\npgx's CopyFrom:\n%s\ncopyIn:\n%s", a, b)
	}
	// A value pgx cannot encode fails CopyIn too.
	bad := typed(9999)
	bad[3] = "not a number"
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"a"}, cols, pgx.CopyFromRows([][]any{bad})); err == nil {
		t.Fatal("pgx's CopyFrom took the bad row")
	}
	if err := copyB([][]any{bad}); err == nil {
		t.Fatal("copyIn took the bad row")
	}
	// A short row is an error, not a corrupt COPY.
	if err := copyB([][]any{{int64(1)}}); err == nil {
		t.Fatal("copyIn took a row of one value")
	}
	// Many rows: the reader hands them over in reads of the connection's
	// size, a row never lost at a boundary.
	big := make([][]any, 20000)
	for i := range big {
		big[i] = typed(1000 + i)
	}
	if _, err := conn.Exec(ctx, `TRUNCATE a, b`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"a"}, cols, pgx.CopyFromRows(big)); err != nil {
		t.Fatal(err)
	}
	if err := copyB(big); err != nil {
		t.Fatal(err)
	}
	if a, b := dump("a"), dump("b"); a != b {
		t.Fatal("the tables differ after 20,000 rows")
	}
}

// TestCopyInAfterWidening: a column widened between two COPYs (bigint to
// numeric, as schema_changes: evolve does, here from another connection)
// takes the next COPY's values by its new type: never the old binary
// form, which PostgreSQL would read as another number without an error.
func TestCopyInAfterWidening(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	Register(conn.TypeMap())
	other, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close(ctx) })
	if _, err := conn.Exec(ctx, `CREATE TABLE w (id int4, v int8)`); err != nil {
		t.Fatal(err)
	}
	write := func(id int32) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := CopyIn(ctx, tx, pgx.Identifier{"w"}, []string{"id", "v"}, nil, 1, func(_ int, row []any) []any {
			return append(row, id, int64(12345))
		}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	write(1)
	if _, err := other.Exec(ctx, `ALTER TABLE w ALTER COLUMN v TYPE numeric`); err != nil {
		t.Fatal(err)
	}
	write(2)
	var got string
	if err := conn.QueryRow(ctx, `SELECT string_agg(v::text, ',' ORDER BY id) FROM w`).Scan(&got); err != nil || got != "12345,12345" {
		t.Fatalf("values %.60q (%v), want 12345,12345", got, err)
	}
}
