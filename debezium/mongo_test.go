package debezium_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// MongoDB documents, as Debezium's MongoDB connector writes them (after
// as a string of strict Extended JSON, the key's id as relaxed Extended
// JSON), become complete history rows: top-level fields as columns typed
// by their Extended JSON, nested documents and arrays as jsonb, _id as the
// key, a field a document lacks (or holds null) null in its version; a
// delete closes the document's version; an update without its document
// (capture.mode change_streams) is an error that says what to set.
func TestMongoDocuments(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	src := &scdtest.Source{Server: "app", DB: "shop", Table: "customers"}
	topic := src.ConnectorTopic("mongodb")
	d := debezium.New([]debezium.Rule{{Topic: topic, Target: "customers_history",
		SequenceBy: config.DefaultSequenceBy["mongodb"], ValidFrom: "source.ts_ms"}}, nil, nil)
	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	oid := `{"$oid": "5d505646cf6d4fe581014ab2"}`
	doc := func(plan, city string) string {
		return `{"_id" : {"$oid" : "5d505646cf6d4fe581014ab2"},"name" : "Anne","plan" : "` + plan + `","qty" : {"$numberLong" : "3"},` +
			`"price" : {"$numberDecimal" : "9.50"},"big" : {"$numberDecimal" : "1.5E+3"},"since" : {"$date" : 1772360130123},"tags" : ["a", "b"],` +
			`"addr" : {"city" : "` + city + `", "zip" : "1010"},"active" : true,"score" : 2.5,"ratio" : {"$numberDouble" : "0.1"},` +
			`"blob" : {"$binary" : "AP8=", "$type" : "00"},"note" : null}`
	}
	cy := func(fields string) string { return `{"_id" : "abc","name" : "Cy","plan" : "basic"` + fields + `}` }
	batches := [][]scdtest.MongoChange{{
		{Op: "r", ID: oid, After: doc("pro", "Wien"), At: at, Ord: 1, Snapshot: "true"},
		{Op: "c", ID: "1004", After: `{"_id" : {"$numberLong" : "1004"},"name" : "Bo","plan" : "basic"}`, At: at.Add(time.Second), Ord: 1},
		{Op: "c", ID: `"abc"`, After: cy(""), At: at.Add(time.Second), Ord: 2},
		{Op: "u", ID: oid, After: doc("team", "Wien"), Updated: `{"plan" : "team"}`, At: at.Add(2 * time.Second), Ord: 1},
		{Op: "u", ID: oid, After: doc("team", "Graz"), Updated: `{"addr.city" : "Graz"}`, At: at.Add(2 * time.Second), Ord: 2},
		{Op: "d", ID: "1004", At: at.Add(3 * time.Second), Ord: 1},
		// A field new to Cy's document opens a version.
		{Op: "u", ID: `"abc"`, After: cy(`,"note" : 42`), Updated: `{"note" : 42}`, At: at.Add(3 * time.Second), Ord: 2},
	}, {
		// $unset: the field is gone from the document, and null in the
		// version it opens.
		{Op: "u", ID: `"abc"`, After: cy(""), Updated: `{}`, At: at.Add(4 * time.Second), Ord: 1},
		// null is the same document, and opens none; a fraction in an
		// integer field widens its column to numeric.
		{Op: "u", ID: `"abc"`, After: cy(`,"note" : null`), Updated: `{}`, At: at.Add(4 * time.Second), Ord: 2},
		{Op: "u", ID: `"abc"`, After: cy(`,"qty" : 7.5`), Updated: `{"qty" : 7.5}`, At: at.Add(5 * time.Second), Ord: 1},
	}, {
		// A field new to the collection, in a later batch (the versions
		// are read back from the table): Cy's version did not have it, so
		// the change opens one.
		{Op: "u", ID: `"abc"`, After: cy(`,"qty" : 7.5,"vip" : true`), Updated: `{"vip" : true}`, At: at.Add(6 * time.Second), Ord: 1},
	}}
	for _, b := range batches {
		var recs [][2][]byte
		for _, c := range b {
			k, v := src.MongoEnvelope(c)
			recs = append(recs, [2][]byte{k, v})
		}
		s := newSink(t, pool, sink.TableSpec{Target: "customers_history"})
		if _, err := s.Apply(ctx, sink.Batch{Events: decodeAll(t, d, topic, recs)}); err != nil {
			t.Fatal(err)
		}
	}
	types := map[string]string{}
	rows, _ := pool.Query(ctx, `SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = 'customers_history'::regclass AND attnum > 0 AND NOT attisdropped`)
	var name, typ string
	for rows.Next() {
		if err := rows.Scan(&name, &typ); err != nil {
			t.Fatal(err)
		}
		types[name] = typ
	}
	for col, want := range map[string]string{"_id": "text", "name": "text", "qty": "numeric", "price": "numeric", "since": "timestamp with time zone",
		"big": "numeric", "tags": "jsonb", "addr": "jsonb", "active": "boolean", "score": "numeric", "ratio": "numeric", "blob": "bytea", "note": "bigint"} {
		if types[col] != want {
			t.Errorf("column %s: %s, want %s", col, types[col], want)
		}
	}
	var big, ratio string
	if err := pool.QueryRow(ctx, `SELECT big::text, ratio::text FROM customers_history WHERE is_current AND _id = '5d505646cf6d4fe581014ab2'`).Scan(&big, &ratio); err != nil ||
		big != "1.5E+3" && big != "1500" || ratio != "0.1" {
		t.Errorf("a decimal in scientific notation and a double: %q, %q, %v; want 1500 and 0.1", big, ratio, err)
	}
	var hist string
	if err := pool.QueryRow(ctx, `SELECT string_agg(concat_ws('|', _id, plan, qty, price, since, tags, addr->>'city', active, score, encode(blob, 'hex'), note,
		to_char(valid_from AT TIME ZONE 'UTC', 'SS'), is_current), ' ' ORDER BY _id, valid_from, scd_id) FROM customers_history`).Scan(&hist); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"1004|basic|01|f",
		"5d505646cf6d4fe581014ab2|pro|3|9.50|2026-03-01 10:15:30.123+00|[\"a\", \"b\"]|Wien|t|2.5|00ff|00|f",
		"5d505646cf6d4fe581014ab2|team|3|9.50|2026-03-01 10:15:30.123+00|[\"a\", \"b\"]|Wien|t|2.5|00ff|02|f",
		"5d505646cf6d4fe581014ab2|team|3|9.50|2026-03-01 10:15:30.123+00|[\"a\", \"b\"]|Graz|t|2.5|00ff|02|t",
		"abc|basic|01|f",
		"abc|basic|42|03|f",
		"abc|basic|04|f",
		"abc|basic|7.5|05|f",
		"abc|basic|7.5|06|t",
	}, " ")
	if hist != want {
		t.Errorf("history:\n got %s\nwant %s", hist, want)
	}

	// capture.mode change_streams: an update with updateDescription only.
	k, v := src.MongoEnvelope(scdtest.MongoChange{Op: "u", ID: oid, Updated: `{"plan" : "x"}`, At: at.Add(4 * time.Second), Ord: 1})
	if _, err := d.Decode(ctx, change.Origin{Partition: change.Partition{Topic: topic}}, k, v); err == nil || !strings.Contains(err.Error(), "change_streams_update_full") {
		t.Errorf("an update without its document: %v; want an error naming change_streams_update_full", err)
	}
}

// Under schema_changes: fail a document without one of the table's
// fields is no dropped column (documents vary), while a field's change of
// type still stops the table.
func TestMongoSparseDocumentsUnderFail(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	src := &scdtest.Source{Server: "app", DB: "shop", Table: "orders"}
	topic := src.ConnectorTopic("mongodb")
	d := debezium.New([]debezium.Rule{{Topic: topic, Target: "orders_history",
		SequenceBy: config.DefaultSequenceBy["mongodb"], ValidFrom: "source.ts_ms"}}, nil, nil)
	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	apply := func(cs ...scdtest.MongoChange) error {
		var recs [][2][]byte
		for _, c := range cs {
			k, v := src.MongoEnvelope(c)
			recs = append(recs, [2][]byte{k, v})
		}
		s := newSink(t, pool, sink.TableSpec{Target: "orders_history", FailOnSchemaChange: true})
		_, err := s.Apply(ctx, sink.Batch{Events: decodeAll(t, d, topic, recs)})
		return err
	}
	if err := apply(scdtest.MongoChange{Op: "c", ID: "1", After: `{"_id" : 1, "a" : "x", "b" : 2}`, At: at, Ord: 1}); err != nil {
		t.Fatal(err)
	}
	if err := apply(scdtest.MongoChange{Op: "u", ID: "1", After: `{"_id" : 1, "b" : 2}`, Updated: `{}`, At: at.Add(time.Second), Ord: 1}); err != nil {
		t.Fatalf("a document without a: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders_history WHERE is_current AND a IS NULL AND b = 2`).Scan(&n); err != nil || n != 1 {
		t.Errorf("current versions without a: %d, %v; want 1", n, err)
	}
	err := apply(scdtest.MongoChange{Op: "u", ID: "1", After: `{"_id" : 1, "b" : 2.5}`, Updated: `{}`, At: at.Add(2 * time.Second), Ord: 1})
	var drift *sink.DriftError
	if !errors.As(err, &drift) {
		t.Errorf("b became a fraction under schema_changes: fail: %v; want a DriftError", err)
	}
}

// MongoDB change events through Avro (a registry's wire format): after is
// a string of Extended JSON there too, the key a record {"id": <_id as
// JSON>}; the history is the one the JsonConverter's records build.
func TestMongoAvro(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	topic := "app.shop.customers"
	json := `{"type":"string","connect.version":1,"connect.name":"io.debezium.data.Json"}`
	value := `{"type":"record","name":"Envelope","namespace":"app.shop.customers","fields":[
		{"name":"before","type":["null",` + json + `],"default":null},{"name":"after","type":["null",` + json + `],"default":null},
		{"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium.connector.mongo","fields":[
			{"name":"version","type":"string"},{"name":"connector","type":"string"},{"name":"name","type":"string"},{"name":"ts_ms","type":"long"},
			{"name":"db","type":"string"},{"name":"collection","type":"string"},{"name":"ord","type":"int"}]}},
		{"name":"op","type":["null","string"],"default":null},{"name":"ts_ms","type":["null","long"],"default":null}]}`
	keySchema := `{"type":"record","name":"Key","namespace":"app.shop.customers","fields":[{"name":"id","type":"string"}]}`
	reg := srfake.New()
	t.Cleanup(reg.Close)
	reg.SeedSchema(topic+"-value", 1, 11, sr.Schema{Schema: value, Type: sr.TypeAvro})
	reg.SeedSchema(topic+"-key", 1, 12, sr.Schema{Schema: keySchema, Type: sr.TypeAvro})
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	vc, err := goavro.NewCodec(value)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := goavro.NewCodec(keySchema)
	if err != nil {
		t.Fatal(err)
	}
	wire := func(c *goavro.Codec, id byte, native map[string]any) []byte {
		b, err := c.BinaryFromNative([]byte{0, 0, 0, 0, id}, native)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	rec := func(op, after string, sec int) [2][]byte {
		var a any
		if after != "" {
			a = goavro.Union("string", after)
		}
		v := wire(vc, 11, map[string]any{"before": nil, "after": a, "op": goavro.Union("string", op), "ts_ms": goavro.Union("long", at.UnixMilli()),
			"source": map[string]any{"version": "3.6.1.Final", "connector": "mongodb", "name": "app", "ts_ms": at.Add(time.Duration(sec) * time.Second).UnixMilli(),
				"db": "shop", "collection": "customers", "ord": 1}})
		return [2][]byte{wire(kc, 12, map[string]any{"id": `{"$oid": "5d505646cf6d4fe581014ab2"}`}), v}
	}
	doc := func(plan string) string {
		return `{"_id": {"$oid": "5d505646cf6d4fe581014ab2"}, "plan": "` + plan + `", "qty": {"$numberLong": "3"}, "changed": {"$date": ` +
			strconv.FormatInt(at.Add(500*time.Millisecond).UnixMilli(), 10) + `}}`
	}
	recs := [][2][]byte{rec("c", doc("basic"), 1), rec("u", doc("pro"), 2), rec("d", "", 3)}
	withKeys := debezium.New([]debezium.Rule{{Topic: topic, Target: "avro_docs", Format: debezium.FormatAvro, Keys: []string{"_id"},
		SequenceBy: config.DefaultSequenceBy["mongodb"], ValidFrom: "source.ts_ms"}}, cl, nil)
	for _, ev := range decodeAll(t, withKeys, topic, recs) { // keys: [_id] is the message key's id
		if len(ev.Key) != 1 || ev.Key[0] != "5d505646cf6d4fe581014ab2" {
			t.Errorf("keys [_id]: key %v", ev.Key)
		}
	}
	d := debezium.New([]debezium.Rule{{Topic: topic, Target: "avro_docs", Format: debezium.FormatAvro,
		SequenceBy: config.DefaultSequenceBy["mongodb"], ValidFrom: "source.ts_ms"}}, cl, nil)
	s := newSink(t, pool, sink.TableSpec{Target: "avro_docs"})
	if _, err := s.Apply(ctx, sink.Batch{Events: decodeAll(t, d, topic, recs)}); err != nil {
		t.Fatal(err)
	}
	var hist string
	if err := pool.QueryRow(ctx, `SELECT string_agg(concat_ws('|', _id, plan, qty, changed, to_char(valid_from AT TIME ZONE 'UTC', 'SS'),
		coalesce(to_char(valid_to AT TIME ZONE 'UTC', 'SS'), 'open')), ' ' ORDER BY valid_from) FROM avro_docs`).Scan(&hist); err != nil {
		t.Fatal(err)
	}
	if want := "5d505646cf6d4fe581014ab2|basic|3|2026-03-01 10:00:00.5+00|01|02 5d505646cf6d4fe581014ab2|pro|3|2026-03-01 10:00:00.5+00|02|03"; hist != want {
		t.Errorf("history:\n got %s\nwant %s", hist, want)
	}
}
