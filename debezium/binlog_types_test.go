package debezium_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// binlogCases are MySQL's and MariaDB's column types as their Debezium
// connectors (3.5/3.6, default modes unless the name says) describe them,
// field for field, and what the history table holds (DESIGN.md section 4,
// docs/sources.md).
var binlogCases = []typeCase{
	{"id", `{"type":"int32","optional":false}`, "integer", 1, "1"},
	// TIME is a duration: negative and beyond 24 hours, to the microsecond.
	{"t_min", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTime","version":1}`, "interval", int64(-3020399000000), "-838:59:59"},
	{"t_max", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTime","version":1}`, "interval", int64(3020399000000), "838:59:59"},
	{"t_day", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTime","version":1}`, "interval", int64(90000500000), "25:00:00.5"},
	{"t_us", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTime","version":1}`, "interval", int64(-1), "-00:00:00.000001"},
	// time.precision.mode=connect: milliseconds.
	{"t_connect", `{"type":"int32","optional":true,"name":"org.apache.kafka.connect.data.Time","version":1}`, "interval", -3723004, "-01:02:03.004"},
	{"flag", `{"type":"boolean","optional":true}`, "boolean", true, "true"},                                                                                          // BIT(1)
	{"mask", `{"type":"bytes","optional":true,"name":"io.debezium.data.Bits","version":1,"parameters":{"length":"12"}}`, "bytea", b64([]byte{0x05, 0x0a}), `\x050a`}, // BIT(12), little-endian
	{"tiny", `{"type":"int16","optional":true}`, "smallint", 1, "1"},                                                                                                 // TINYINT(1)
	{"yr", `{"type":"int32","optional":true,"name":"io.debezium.time.Year","version":1}`, "integer", 2026, "2026"},
	{"ubig", `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"0","connect.decimal.precision":"20"}}`,
		"numeric", scdtest.DecimalB64("18446744073709551615"), "18446744073709551615"}, // BIGINT UNSIGNED, precise
	{"ubig_long", `{"type":"int64","optional":true}`, "bigint", int64(-1), "-1"}, // BIGINT UNSIGNED 2^64-1 in long mode: wrapped by Debezium
	{"price", `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}}`,
		"numeric", scdtest.DecimalB64("-12345"), "-123.45"},
	{"born", `{"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1}`, "date", 20513, "2026-03-01"},
	{"dt", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1}`, "timestamp without time zone", int64(1772323200123456), "2026-03-01 00:00:00.123456"},
	{"ts", `{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1}`, "timestamp with time zone", "2026-03-01T00:00:00.123456Z", "2026-03-01 00:00:00.123456+00"},
	{"kind", `{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"x,y"}}`, "text", "y", "y"},
	{"tags", `{"type":"string","optional":true,"name":"io.debezium.data.EnumSet","version":1,"parameters":{"allowed":"a,b,c"}}`, "text", "a,c", "a,c"},
	{"doc", `{"type":"string","optional":true}`, "text", `{"a": 1}`, `{"a": 1}`},                                                           // MariaDB JSON: a plain string
	{"mdoc", `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`, "jsonb", `{"b":2,"a":1}`, `{"a": 1, "b": 2}`}, // MySQL JSON
	// GEOMETRY (here POINT(1 2), SRID 4326): Debezium's struct of the WKB
	// and the SRID, kept as they came.
	{"geo", `{"type":"struct","fields":[{"type":"bytes","optional":false,"field":"wkb"},{"type":"int32","optional":true,"field":"srid"}],` +
		`"optional":true,"name":"io.debezium.data.geometry.Geometry","version":1,"doc":"Geometry"}`, "jsonb",
		map[string]any{"wkb": "AQEAAAAAAAAAAADwPwAAAAAAAABA", "srid": 4326}, `{"wkb": "AQEAAAAAAAAAAADwPwAAAAAAAABA", "srid": 4326}`},
}

// MySQL's and MariaDB's types reach the history table as their users mean
// them; TIME above all is a duration (interval), not a time of day (a
// PostgreSQL envelope's MicroTime stays time). A history table made when
// TIME became time is altered to interval, its versions kept.
func TestBinlogTypes(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	src := &scdtest.Source{Server: "inv", DB: "inv", Table: "typed", Keys: []string{"id"}}
	for _, c := range binlogCases {
		src.Cols = append(src.Cols, scdtest.Col{Name: c.col, Schema: c.schema})
	}
	d := debezium.New([]debezium.Rule{{Topic: src.MariaDBTopic(), Target: "typed_history",
		SequenceBy: config.DefaultSequenceBy["mariadb"], ValidFrom: "source.ts_ms"}}, nil, nil)
	row := scdtest.Row{}
	for _, c := range binlogCases {
		row[c.col] = c.value
	}
	commit := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	k, v := src.MariaDBEnvelope(scdtest.Change{Op: "c", After: row, Commit: commit}, scdtest.Binlog{GTID: "0-1-7", File: "mysql-bin.000003", Pos: 4410, ServerID: 1})

	// A table made by an older scd2sink, which took TIME for time of day.
	if _, err := pool.Exec(ctx, `CREATE TABLE old_history (id integer, t_us time, scd_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		valid_from timestamptz NOT NULL, valid_to timestamptz, is_current boolean NOT NULL, scd_seq bytea)`); err != nil {
		t.Fatal(err)
	}
	s := newSink(t, pool, sink.TableSpec{Target: "typed_history"})
	if _, err := s.Apply(ctx, sink.Batch{Events: decodeAll(t, d, src.MariaDBTopic(), [][2][]byte{{k, v}})}); err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	rows, _ := pool.Query(ctx, `SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = 'typed_history'::regclass AND attnum > 0 AND NOT attisdropped`)
	var name, typ string
	if _, err := pgx.ForEachRow(rows, []any{&name, &typ}, func() error { types[name] = typ; return nil }); err != nil {
		t.Fatal(err)
	}
	cols := make([]string, len(binlogCases))
	for i, c := range binlogCases {
		cols[i] = c.col
	}
	got := texts(t, pool, "typed_history", 1, cols)
	for _, c := range binlogCases {
		if types[c.col] != c.pgType {
			t.Errorf("%s: column type %s, want %s", c.col, types[c.col], c.pgType)
		}
		if g := got[c.col]; g == nil || *g != c.want {
			t.Errorf("%s (%s) = %v, want %s", c.col, c.pgType, deref(g), c.want)
		}
	}

	t.Run("a time column from before is altered to interval", func(t *testing.T) {
		osrc := &scdtest.Source{Server: "inv", DB: "inv", Table: "old", Keys: []string{"id"}, Cols: []scdtest.Col{
			{Name: "id", Schema: `{"type":"int32","optional":false}`},
			{Name: "t_us", Schema: `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTime","version":1}`},
		}}
		if _, err := pool.Exec(ctx, `INSERT INTO old_history (id, t_us, valid_from, is_current, scd_seq) VALUES (1, '01:00', '2026-02-01', true, '\x2000200101'::bytea)`); err != nil {
			t.Fatal(err)
		}
		od := debezium.New([]debezium.Rule{{Topic: osrc.MariaDBTopic(), Target: "old_history",
			SequenceBy: config.DefaultSequenceBy["mariadb"], ValidFrom: "source.ts_ms"}}, nil, nil)
		osink := newSink(t, pool, sink.TableSpec{Target: "old_history"})
		var recs [][2][]byte
		for i, us := range []int64{3600000000, 90000000000} { // unchanged, then 25 h
			k, v := osrc.MariaDBEnvelope(scdtest.Change{Op: "u", After: scdtest.Row{"id": 1, "t_us": us}, Commit: commit.Add(time.Duration(i) * time.Hour)},
				scdtest.Binlog{GTID: "0-1-" + string(rune('8'+i)), File: "mysql-bin.000003", Pos: int64(5000 + i*300), ServerID: 1})
			recs = append(recs, [2][]byte{k, v})
		}
		if _, err := osink.Apply(ctx, sink.Batch{Events: decodeAll(t, od, osrc.MariaDBTopic(), recs)}); err != nil {
			t.Fatal(err)
		}
		var typ, hist string
		if err := pool.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'old_history'::regclass AND attname = 't_us'`).Scan(&typ); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT string_agg(t_us::text || ' ' || is_current, ', ' ORDER BY valid_from) FROM old_history`).Scan(&hist); err != nil {
			t.Fatal(err)
		}
		if typ != "interval" || hist != "01:00:00 false, 25:00:00 true" {
			t.Errorf("old table: t_us %s, history %q; want interval, \"01:00:00 false, 25:00:00 true\"", typ, hist)
		}
	})
}
