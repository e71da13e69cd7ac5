package debezium_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// typeCase is one column of the type table (DESIGN.md section 4): its
// Connect schema, the PostgreSQL type the sink must create, a value as
// Debezium's JsonConverter writes it, and that value as PostgreSQL prints it.
type typeCase struct {
	col, schema, pgType string
	value               any
	want                string
}

var b64 = base64.StdEncoding.EncodeToString

var typeCases = []typeCase{
	{"id", `{"type":"int32","optional":false}`, "integer", 1, "1"},
	{"i8", `{"type":"int8","optional":true}`, "smallint", 7, "7"},
	{"small", `{"type":"int16","optional":true}`, "smallint", -5, "-5"},
	{"big", `{"type":"int64","optional":true}`, "bigint", int64(9007199254740993), "9007199254740993"},
	{"r4", `{"type":"float","optional":true}`, "real", 0.25, "0.25"},
	{"ratio", `{"type":"double","optional":true}`, "double precision", 1.5, "1.5"},
	{"active", `{"type":"boolean","optional":true}`, "boolean", true, "true"},
	{"name", `{"type":"string","optional":true}`, "text", "Ann \"the\" O'Neil", `Ann "the" O'Neil`},
	{"blob", `{"type":"bytes","optional":true}`, "bytea", b64([]byte{0, 1, 0xfe}), `\x0001fe`},
	{"balance", `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}}`,
		"numeric", "/w==", "-0.01"},
	{"amount", `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"12"}}`,
		"numeric", scdtest.DecimalB64("-123450"), "-1234.50"},
	{"vdec", `{"type":"struct","fields":[{"type":"int32","optional":false,"field":"scale"},{"type":"bytes","optional":false,"field":"value"}],"optional":true,"name":"io.debezium.data.VariableScaleDecimal","version":1,"doc":"Variable scaled decimal"}`,
		"numeric", map[string]any{"scale": 3, "value": scdtest.DecimalB64("12345")}, "12.345"},
	{"birth", `{"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1}`, "date",
		scdtest.Days(time.Date(1960, 2, 29, 0, 0, 0, 0, time.UTC)), "1960-02-29"},
	{"cdate", `{"type":"int32","optional":true,"name":"org.apache.kafka.connect.data.Date","version":1}`, "date", 20454, "2026-01-01"},
	{"t_ms", `{"type":"int32","optional":true,"name":"io.debezium.time.Time","version":1}`, "time without time zone", 3723004, "01:02:03.004"},
	{"t_us", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTime","version":1}`, "time without time zone", int64(3723004005), "01:02:03.004005"},
	{"t_ns", `{"type":"int64","optional":true,"name":"io.debezium.time.NanoTime","version":1}`, "time without time zone", int64(3723004005006), "01:02:03.004005"},
	{"ctime", `{"type":"int32","optional":true,"name":"org.apache.kafka.connect.data.Time","version":1}`, "time without time zone", 3723004, "01:02:03.004"},
	{"ts_ms", `{"type":"int64","optional":true,"name":"io.debezium.time.Timestamp","version":1}`, "timestamp without time zone", int64(1767225600123), "2026-01-01 00:00:00.123"},
	{"cts", `{"type":"int64","optional":true,"name":"org.apache.kafka.connect.data.Timestamp","version":1}`, "timestamp without time zone", int64(-86400000), "1969-12-31 00:00:00"},
	{"ts_us", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1}`, "timestamp without time zone", int64(1767225600123456), "2026-01-01 00:00:00.123456"},
	{"ts_ns", `{"type":"int64","optional":true,"name":"io.debezium.time.NanoTimestamp","version":1}`, "timestamp without time zone", int64(1767225600123456789), "2026-01-01 00:00:00.123456"},
	{"ts_inf", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1}`, "timestamp without time zone", int64(9223372036825200000), "infinity"},
	{"tstz", `{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1}`, "timestamp with time zone", "2026-01-02T03:04:05.678901Z", "2026-01-02 03:04:05.678901+00"},
	{"tstz_inf", `{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1}`, "timestamp with time zone", "-infinity", "-infinity"},
	{"ttz", `{"type":"string","optional":true,"name":"io.debezium.time.ZonedTime","version":1}`, "time with time zone", "01:02:03.5Z", "01:02:03.5+00"},
	{"dur", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroDuration","version":1}`, "interval", int64(90061000000), "25:01:01"},
	{"ival", `{"type":"string","optional":true,"name":"io.debezium.time.Interval","version":1}`, "interval", "P1Y2M3DT4H5M6.78S", "1 year 2 mons 3 days 04:05:06.78"},
	{"uid", `{"type":"string","optional":true,"name":"io.debezium.data.Uuid","version":1}`, "uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"},
	{"doc", `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`, "jsonb", `{"b": 2, "a": [1, 2.50]}`, `{"a": [1, 2.50], "b": 2}`},
	{"doc_null", `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`, "jsonb", `null`, `null`},
	{"doc_big", `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`, "jsonb", `12345678901234567890`, `12345678901234567890`},
	{"doc_dec", `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`, "jsonb", `1.10`, `1.10`},
	{"doc_str", `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`, "jsonb", `"plain string"`, `"plain string"`},
	{"x", `{"type":"string","optional":true,"name":"io.debezium.data.Xml","version":1}`, "xml", "<a>1</a>", "<a>1</a>"},
	{"tags", `{"type":"array","items":{"type":"string","optional":true},"optional":true}`, "text[]", []string{"a", "b c"}, `{a,"b c"}`},
	{"nums", `{"type":"array","items":{"type":"int32","optional":true},"optional":true}`, "integer[]", []int{1, 2}, `{1,2}`},
}

func typedSource() *scdtest.Source {
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "typed", Keys: []string{"id"}}
	for _, c := range typeCases {
		src.Cols = append(src.Cols, scdtest.Col{Name: c.col, Schema: c.schema})
	}
	return src
}

func newSink(t *testing.T, pool *pgxpool.Pool, spec sink.TableSpec) *sink.Sink {
	t.Helper()
	s, err := sink.New(sink.Config{Tables: []sink.TableSpec{spec}}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["timezone"] = "UTC"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// decodeAll decodes records of src's topic into events.
func decodeAll(t *testing.T, d *debezium.Decoder, topic string, recs [][2][]byte) []*change.Event {
	t.Helper()
	var evs []*change.Event
	for i, r := range recs {
		ev, err := d.Decode(context.Background(), change.Origin{Partition: change.Partition{Topic: topic}, Offset: int64(i)}, r[0], r[1])
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// texts reads the given columns of the key's current version as PostgreSQL prints them.
func texts(t *testing.T, pool *pgxpool.Pool, table string, id int, cols []string) map[string]*string {
	t.Helper()
	sel := make([]string, len(cols))
	for i, c := range cols {
		sel[i] = pgx.Identifier{c}.Sanitize() + "::text"
	}
	vals := make([]*string, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	q := fmt.Sprintf("SELECT %s FROM %s WHERE id = $1 AND is_current", strings.Join(sel, ", "), table)
	if err := pool.QueryRow(context.Background(), q, id).Scan(ptrs...); err != nil {
		t.Fatalf("reading %s: %v", table, err)
	}
	out := map[string]*string{}
	for i, c := range cols {
		out[c] = vals[i]
	}
	return out
}

// format renders changes of a source as one of the formats.
type format struct {
	name    string
	decoder func(t testing.TB, src *scdtest.Source) *debezium.Decoder
	render  func(src *scdtest.Source, c scdtest.Change) (key, value []byte)
}

var formats = []format{
	{"json", func(t testing.TB, src *scdtest.Source) *debezium.Decoder {
		return debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: "typed_history",
			SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, nil, nil)
	}, (*scdtest.Source).Envelope},
	{"avro", func(t testing.TB, src *scdtest.Source) *debezium.Decoder {
		return debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: "typed_history", Format: debezium.FormatAvro,
			SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, avroRegistry(t, src), nil)
	}, func(src *scdtest.Source, c scdtest.Change) ([]byte, []byte) { return src.AvroEnvelope(c, 1, 2) }},
}

// avroRegistry is a fake schema registry holding src's value schema as id
// 1 and its key schema as id 2, as Debezium's AvroConverter registers them.
func avroRegistry(t testing.TB, src *scdtest.Source) debezium.Registry {
	t.Helper()
	reg := srfake.New()
	t.Cleanup(reg.Close)
	reg.SeedSchema(src.Topic()+"-value", 1, 1, sr.Schema{Schema: src.AvroValueSchema(), Type: sr.TypeAvro})
	reg.SeedSchema(src.Topic()+"-key", 1, 2, sr.Schema{Schema: src.AvroKeySchema(), Type: sr.TypeAvro})
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func TestTypesThroughTheSink(t *testing.T) {
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) { typesThroughTheSink(t, f) })
	}
}

func typesThroughTheSink(t *testing.T, f format) {
	ctx := context.Background()
	pool := newPool(t)
	src := typedSource()
	d := f.decoder(t, src)
	s := newSink(t, pool, sink.TableSpec{Target: "typed_history"})

	full, nulls := scdtest.Row{}, scdtest.Row{"id": 2}
	for _, c := range typeCases {
		full[c.col] = c.value
	}
	commit := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var recs [][2][]byte
	for i, row := range []scdtest.Row{full, nulls} {
		k, v := f.render(src, scdtest.Change{Op: "r", After: row, LSN: 100, Commit: commit, Snapshot: "true", TxID: int64(i)})
		recs = append(recs, [2][]byte{k, v})
	}
	if _, err := s.Apply(ctx, sink.Batch{Events: decodeAll(t, d, src.Topic(), recs)}); err != nil {
		t.Fatal(err)
	}

	t.Run("columns: source order and types, then scd_ columns", func(t *testing.T) {
		rows, err := pool.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
			WHERE attrelid = 'typed_history'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`)
		if err != nil {
			t.Fatal(err)
		}
		type col struct{ name, typ string }
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (col, error) {
			var c col
			return c, r.Scan(&c.name, &c.typ)
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range typeCases {
			if i >= len(got) || got[i].name != c.col || got[i].typ != c.pgType {
				t.Fatalf("column %d: got %+v, want %s %s (all: %v)", i+1, got[min(i, len(got)-1)], c.col, c.pgType, got)
			}
		}
		if next := got[len(typeCases)].name; next != "scd_id" {
			t.Errorf("after the source columns comes %s, want scd_id", next)
		}
	})
	cols := make([]string, len(typeCases))
	for i, c := range typeCases {
		cols[i] = c.col
	}
	t.Run("values stored exactly", func(t *testing.T) {
		got := texts(t, pool, "typed_history", 1, cols)
		for _, c := range typeCases {
			t.Run(c.col, func(t *testing.T) {
				if g := got[c.col]; g == nil || *g != c.want {
					t.Errorf("%s (%s) = %v, want %s", c.col, c.pgType, deref(g), c.want)
				}
			})
		}
	})
	t.Run("NULLs of every type", func(t *testing.T) {
		got := texts(t, pool, "typed_history", 2, cols)
		for _, c := range typeCases[1:] {
			if g := got[c.col]; g != nil {
				t.Errorf("%s = %q, want NULL", c.col, *g)
			}
		}
	})
	t.Run("a replay changes nothing", func(t *testing.T) {
		// Read back from PostgreSQL (no cache), every value compares equal
		// to the event's: no version is opened.
		s2 := newSink(t, pool, sink.TableSpec{Target: "typed_history"})
		recs2 := [][2][]byte{}
		for _, row := range []scdtest.Row{full, nulls} {
			k, v := f.render(src, scdtest.Change{Op: "u", After: row, LSN: 200, Commit: commit.Add(time.Hour)})
			recs2 = append(recs2, [2][]byte{k, v})
		}
		res, err := s2.Apply(ctx, sink.Batch{Events: decodeAll(t, d, src.Topic(), recs2)})
		if err != nil {
			t.Fatal(err)
		}
		if res.VersionsOpened != 0 {
			t.Fatalf("an update with equal values opened %d versions", res.VersionsOpened)
		}
	})
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

// Debezium's unavailable-value placeholder (an unchanged TOASTed value) in
// text, bytea, array and JSON columns keeps the previous version's value
// and is never a change of a tracked column.
func TestUnavailablePlaceholdersInTypedColumns(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	src := typedSource()
	d := debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: "typed_history",
		SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, nil, nil)
	s := newSink(t, pool, sink.TableSpec{Target: "typed_history"})
	first := scdtest.Row{"id": 1, "small": 1, "name": "long text", "blob": b64([]byte("long bytes")),
		"tags": []string{"x", "y"}, "doc": `{"k": "long json"}`}
	toasted := scdtest.Row{"id": 1, "small": 2, "name": change.Unavailable, "blob": b64([]byte(change.Unavailable)),
		"tags": []string{change.Unavailable}, "doc": change.Unavailable}
	untouched := scdtest.Row{"id": 1, "small": 2, "name": change.Unavailable, "blob": b64([]byte(change.Unavailable)),
		"tags": []string{change.Unavailable}, "doc": change.Unavailable}
	commit := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var recs [][2][]byte
	for i, row := range []scdtest.Row{first, toasted, untouched} {
		k, v := src.Envelope(scdtest.Change{Op: map[bool]string{true: "c", false: "u"}[i == 0], After: row,
			LSN: int64(100 + i), Commit: commit.Add(time.Duration(i) * time.Hour)})
		recs = append(recs, [2][]byte{k, v})
	}
	// Out of order, to go through the repair path as well.
	evs := decodeAll(t, d, src.Topic(), recs)
	if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{evs[0], evs[2]}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{evs[1]}}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM typed_history`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d versions (%v), want 2: the placeholder-only update is no change", n, err)
	}
	got := texts(t, pool, "typed_history", 1, []string{"small", "name", "blob", "tags", "doc"})
	want := map[string]string{"small": "2", "name": "long text", "blob": `\x6c6f6e67206279746573`, "tags": "{x,y}", "doc": `{"k": "long json"}`}
	for c, w := range want {
		if g := got[c]; g == nil || *g != w {
			t.Errorf("%s = %s, want %s", c, deref(g), w)
		}
	}
}

// A source's schema evolves: a new column is added to the history table
// (typed, nullable), a dropped column is NULL in new versions, and a type
// change that no longer fits the table's column dead-letters the event
// with the reason.
func TestSchemaEvolution(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	col := func(name, schema string) scdtest.Col { return scdtest.Col{Name: name, Schema: schema} }
	id := col("id", `{"type":"int32","optional":false}`)
	plan := col("plan", `{"type":"string","optional":true}`)
	score := col("score", `{"type":"int32","optional":true}`)
	city := col("city", `{"type":"string","optional":true}`)
	scoreText := col("score", `{"type":"string","optional":true}`)
	versions := [][]scdtest.Col{{id, plan, score}, {id, plan, score, city}, {id, plan, city}, {id, plan, city, scoreText}}
	rows := []scdtest.Row{
		{"id": 1, "plan": "basic", "score": 10},
		{"id": 1, "plan": "pro", "score": 11, "city": "Wien"},
		{"id": 1, "plan": "team", "city": "Linz"},
		{"id": 1, "plan": "enterprise", "city": "Graz", "score": "high"},
	}
	d := debezium.New([]debezium.Rule{{Topic: "shop.public.evolving", Target: "evolving_history",
		SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, nil, nil)
	s := newSink(t, pool, sink.TableSpec{Target: "evolving_history"})
	at := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var mismatches, dead int
	for i, cols := range versions {
		src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "evolving", Keys: []string{"id"}, Cols: cols}
		k, v := src.Envelope(scdtest.Change{Op: map[bool]string{true: "c", false: "u"}[i == 0], After: rows[i],
			LSN: int64(100 + i), Commit: at.Add(time.Duration(i) * time.Hour)})
		res, err := s.Apply(ctx, sink.Batch{Events: decodeAll(t, d, src.Topic(), [][2][]byte{{k, v}})})
		if err != nil {
			t.Fatalf("version %d: %v", i+1, err)
		}
		mismatches += res.TypeMismatches
		dead += res.DeadLetters
	}
	var got string
	if err := pool.QueryRow(ctx, `SELECT string_agg(concat_ws(':', plan, coalesce(score::text, 'NULL'), coalesce(city, 'NULL'), is_current), ' ' ORDER BY scd_seq)
		FROM evolving_history`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "basic:10:NULL:f pro:11:Wien:f team:NULL:Linz:t"; got != want {
		t.Errorf("history %q, want %q", got, want)
	}
	var typ string
	if err := pool.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'evolving_history'::regclass AND attname = 'city'`).Scan(&typ); err != nil || typ != "text" {
		t.Errorf("city column: %q, %v", typ, err)
	}
	if dead != 1 || mismatches != 1 {
		t.Fatalf("%d dead letters, %d type mismatches; want 1 and 1", dead, mismatches)
	}
	var msg string
	if err := pool.QueryRow(ctx, `SELECT error FROM scd2sink_dead_letters`).Scan(&msg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(msg, "column score: the source's type changed to text, incompatible with the history table's integer") {
		t.Errorf("dead letter: %s", msg)
	}
}

// Table and column names come from configuration and events: quotes,
// semicolons, uppercase and names beyond PostgreSQL's 63 bytes are all
// identifiers, never SQL.
func TestUntrustedIdentifiers(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	long := strings.Repeat("long_name_", 7) // 70 bytes: PostgreSQL keeps 63
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "odd", Keys: []string{`Id "Key"`},
		Cols: []scdtest.Col{
			{Name: `Id "Key"`, Schema: `{"type":"int32","optional":false}`},
			{Name: `plan'; DROP TABLE x; --`, Schema: `{"type":"string","optional":true}`},
			{Name: "MixedCase", Schema: `{"type":"string","optional":true}`},
			{Name: long, Schema: `{"type":"string","optional":true}`},
		}}
	target := `Odd "History"; DROP`
	d := debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: target,
		SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, nil, nil)
	s := newSink(t, pool, sink.TableSpec{Target: target})
	at := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var recs [][2][]byte
	for i, plan := range []string{"basic", "pro"} {
		k, v := src.Envelope(scdtest.Change{Op: "u", LSN: int64(10 + i), Commit: at.Add(time.Duration(i) * time.Hour),
			After: scdtest.Row{`Id "Key"`: 1, `plan'; DROP TABLE x; --`: plan, "MixedCase": "M" + plan, long: "L" + plan}})
		recs = append(recs, [2][]byte{k, v})
	}
	res, err := s.Apply(ctx, sink.Batch{Events: decodeAll(t, d, src.Topic(), recs)})
	if err != nil || res.DeadLetters != 0 {
		t.Fatalf("%+v, %v", res, err)
	}
	var got string
	q := fmt.Sprintf(`SELECT string_agg(concat_ws('|', %s, %s, %s, %s, is_current), ' ' ORDER BY scd_seq) FROM %s`,
		pgx.Identifier{`Id "Key"`}.Sanitize(), pgx.Identifier{`plan'; DROP TABLE x; --`}.Sanitize(),
		pgx.Identifier{"MixedCase"}.Sanitize(), pgx.Identifier{long[:63]}.Sanitize(), pgx.Identifier{target}.Sanitize())
	if err := pool.QueryRow(ctx, q).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "1|basic|Mbasic|Lbasic|f 1|pro|Mpro|Lpro|t"; got != want {
		t.Errorf("history %q, want %q", got, want)
	}
	verify, err := s.Verify(ctx, target)
	if err != nil || len(verify) != 0 {
		t.Errorf("verify: %v, %v", verify, err)
	}
}

// A primary-key change is a delete of the old key, a tombstone and a create
// of the new key (header __debezium.oldkey) whose unchanged TOASTed columns
// are placeholders: they take the old key's values, never the new key's
// own earlier life, in whatever batches the events arrive.
func TestPrimaryKeyChange(t *testing.T) {
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "docs", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`},
			{Name: "plan", Schema: `{"type":"string","optional":true}`}, {Name: "bio", Schema: `{"type":"string","optional":true}`}}}
	at := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	type rec struct {
		k, v   []byte
		oldKey string
	}
	mk := func(op string, lsn int64, row scdtest.Row, oldKey string) rec {
		c := scdtest.Change{Op: op, LSN: lsn, Commit: at.Add(time.Duration(lsn) * time.Minute)}
		if op == "d" {
			c.Before = row
		} else {
			c.After = row
		}
		k, v := src.Envelope(c)
		return rec{k, v, oldKey}
	}
	recs := []rec{
		mk("c", 50, scdtest.Row{"id": 2, "plan": "team", "bio": "the old life of 2"}, ""),
		mk("d", 60, scdtest.Row{"id": 2}, ""),
		mk("c", 100, scdtest.Row{"id": 1, "plan": "basic", "bio": "long text of 1"}, ""),
		mk("u", 110, scdtest.Row{"id": 1, "plan": "pro", "bio": change.Unavailable}, ""),
		mk("d", 120, scdtest.Row{"id": 1}, ""),
		mk("c", 121, scdtest.Row{"id": 2, "plan": "pro", "bio": change.Unavailable}, `{"id":1}`),
		mk("u", 130, scdtest.Row{"id": 2, "plan": "team", "bio": change.Unavailable}, ""),
	}
	splits := map[string][]int{"one batch": {7}, "old key applied before": {5, 7}, "one by one": {1, 2, 3, 4, 5, 6, 7}, "new key first": {0}}
	for name, cuts := range splits {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			pool := newPool(t)
			d := debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: "docs_history",
				SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, nil, nil)
			s := newSink(t, pool, sink.TableSpec{Target: "docs_history"}) // every column tracked
			var evs []*change.Event
			for i, r := range recs {
				var hs []debezium.Header
				if r.oldKey != "" {
					hs = append(hs, debezium.Header{Key: debezium.OldKeyHeader, Value: []byte(r.oldKey)})
				}
				ev, err := d.Decode(ctx, change.Origin{Partition: change.Partition{Topic: src.Topic()}, Offset: int64(i)}, r.k, r.v, hs...)
				if err != nil {
					t.Fatal(err)
				}
				evs = append(evs, ev)
			}
			batches := [][]*change.Event{}
			prev := 0
			for _, c := range cuts {
				if c == 0 { // the new key's events before the old key's
					batches = [][]*change.Event{{evs[0], evs[1], evs[5], evs[6]}, {evs[2], evs[3], evs[4]}}
					break
				}
				batches = append(batches, evs[prev:c])
				prev = c
			}
			for _, b := range batches {
				if _, err := s.Apply(ctx, sink.Batch{Events: b}); err != nil {
					t.Fatal(err)
				}
			}
			var got string
			if err := pool.QueryRow(ctx, `SELECT string_agg(concat_ws(':', id, plan, coalesce(bio, 'NULL'), is_current), ' ' ORDER BY id, scd_seq)
				FROM docs_history`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			want := "1:basic:long text of 1:f 1:pro:long text of 1:f 2:team:the old life of 2:f 2:pro:long text of 1:f 2:team:long text of 1:t"
			if name == "new key first" {
				// The old key is applied after the create: its value was
				// not known, and the columns are NULL (see docs/formats-and-types.md).
				want = "1:basic:long text of 1:f 1:pro:long text of 1:f 2:team:the old life of 2:f 2:pro:NULL:f 2:team:NULL:t"
			}
			if got != want {
				t.Errorf("history\n got %s\nwant %s", got, want)
			}
		})
	}
}
