package debezium

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

var rules = []Rule{
	{Topic: "shop.public.customers", Target: "customers_history", Keys: []string{"customer_id"},
		SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"},
	{Topic: "shop.public.orders", Target: "orders_history", SequenceBy: []string{"source.sequence", "source.lsn"}, ValidFrom: "ts_ms"},
	{Topic: "inv.items", Target: "items_history", Keys: []string{"sku"},
		SequenceBy: []string{"source.file", "source.pos", "source.row"}, ValidFrom: "source.ts_ms"},
}

func origin(topic string) change.Origin {
	return change.Origin{Partition: change.Partition{Topic: topic, Partition: 2}, Offset: 17}
}

const withSchema = `{"schema":{"type":"struct","fields":[
  {"type":"struct","field":"before","fields":[{"type":"string","field":"customer_id"}]},
  {"type":"struct","field":"after","fields":[
    {"type":"string","field":"customer_id"},
    {"type":"int64","name":"io.debezium.time.MicroTimestamp","field":"signed_up"},
    {"type":"int32","name":"io.debezium.time.Date","field":"birthday"},
    {"type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2"},"field":"balance"},
    {"type":"string","name":"io.debezium.time.ZonedTimestamp","field":"seen"}]}]},
 "payload":{"before":null,"after":{"customer_id":"C1","signed_up":1767225600000000,"birthday":20454,"balance":"/zg=","seen":"2026-01-02T03:04:05Z"},
  "source":{"lsn":24023928,"ts_ms":1767225600000},"op":"c","ts_ms":1767225600123}}`

func TestDecode(t *testing.T) {
	d := New(rules, nil, nil)
	t.Run("with schema: logical types", func(t *testing.T) {
		ev, err := d.Decode(context.Background(), origin("shop.public.customers"), []byte(`{"customer_id":"C1"}`), []byte(withSchema))
		if err != nil {
			t.Fatal(err)
		}
		day := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		if ev.Op != change.OpCreate || ev.Seq.String() != "[24023928]" || !ev.ValidFrom.Equal(day) || ev.Key[0] != "C1" {
			t.Fatalf("event %+v", ev)
		}
		after, err := ev.DecodeAfter()
		if err != nil {
			t.Fatal(err)
		}
		if got := after["signed_up"]; got != day {
			t.Errorf("signed_up %v", got)
		}
		if got := after["birthday"]; got != day {
			t.Errorf("birthday %v", got)
		}
		if got := after["balance"].(pgtype.Numeric); got.Int.Int64() != -200 || got.Exp != -2 {
			t.Errorf("balance %v", got)
		}
		if got := after["seen"]; !got.(time.Time).Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
			t.Errorf("seen %v", got)
		}
		if cols := ev.Row.Columns(); len(cols) != 5 || cols[1] != (change.Column{Name: "signed_up", PGType: "timestamp"}) || cols[3].PGType != "numeric" {
			t.Errorf("columns %v", cols)
		}
	})
	t.Run("without schema, key fields from the message key", func(t *testing.T) {
		ev, err := d.Decode(context.Background(), origin("shop.public.orders"), []byte(`{"shop":1,"order_id":"A-9"}`),
			[]byte(`{"before":{"shop":1,"order_id":"A-9"},"after":null,"source":{"sequence":"[\"100\",\"120\"]","lsn":120},"op":"d","ts_ms":1767225600000}`))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Op != change.OpDelete || ev.Seq.String() != "[100,120,120]" || strings.Join(ev.KeyNames, ",") != "shop,order_id" ||
			ev.Key[0] != json.Number("1") || ev.Key[1] != "A-9" || ev.AfterJSON != nil {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("mysql binlog position, key from after", func(t *testing.T) {
		ev, err := d.Decode(context.Background(), origin("inv.items"), nil,
			[]byte(`{"after":{"sku":"X","qty":3},"source":{"file":"mysql-bin.000003","pos":154,"row":0,"ts_ms":1767225600000},"op":"u"}`))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Key[0] != "X" || ev.Seq.String() != `["mysql-bin.000003",154,0]` {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("image, sequence and key identity share an allocation, apart", func(t *testing.T) {
		for _, c := range []struct{ topic, key, value string }{
			{"shop.public.customers", `{"customer_id":"C1"}`, withSchema},
			{"shop.public.orders", `{"shop":1,"order_id":"A-9","region":"eu"}`, // three key fields: more than the event holds in itself
				`{"before":null,"after":{"shop":1,"order_id":"A-9","region":"eu","n":2},"source":{"sequence":"[\"100\",\"120\"]","lsn":120},"op":"u","ts_ms":1767225600000}`},
		} {
			ev, err := d.Decode(context.Background(), origin(c.topic), []byte(c.key), []byte(c.value))
			if err != nil {
				t.Fatal(err)
			}
			img, seq, id := string(ev.AfterJSON), ev.Seq.String(), ev.KeyID()
			if want := change.KeyID(ev.Key); id != want {
				t.Fatalf("%s: key identity %q, want %q", c.topic, id, want)
			}
			if !strings.HasPrefix(img, `{"`) || !strings.HasSuffix(img, `}`) {
				t.Fatalf("%s: image %q", c.topic, img)
			}
			_ = append(ev.Seq, 0xff, 0xff, 0xff)
			_ = append(ev.AfterJSON, 0xff, 0xff, 0xff)
			if string(ev.AfterJSON) != img || ev.Seq.String() != seq || ev.KeyID() != id || change.KeyID(ev.Key) != id {
				t.Fatalf("%s: an append to one part wrote into another", c.topic)
			}
		}
	})
	t.Run("truncate", func(t *testing.T) {
		ev, err := d.Decode(context.Background(), origin("shop.public.customers"), nil, []byte(`{"source":{"lsn":5,"ts_ms":1767225600000},"op":"t"}`))
		if err != nil || ev.Op != change.OpTruncate || ev.Key != nil {
			t.Fatalf("event %+v, %v", ev, err)
		}
	})
}

func TestDecodeSkipsAndRejects(t *testing.T) {
	d := New(rules, nil, nil)
	key := []byte(`{"customer_id":"C1"}`)
	ok := `"after":{"customer_id":"C1"},"source":{"lsn":1,"ts_ms":1}`
	tests := []struct {
		name, topic string
		key, value  []byte
		skip        bool
		want        string
	}{
		{"tombstone", "shop.public.customers", key, nil, true, ""},
		{"null payload", "shop.public.customers", key, []byte(`{"schema":{},"payload":null}`), true, ""},
		{"heartbeat", "shop.public.customers", key, []byte(`{"ts_ms":1767225600000}`), true, ""},
		// <prefix>.transaction and <prefix> of a dotted topic.prefix, taken by a pattern.
		{"transaction begin", "shop.public.customers", []byte(`{"id":"571:53195832"}`),
			[]byte(`{"status":"BEGIN","id":"571:53195832","ts_ms":1767225600000,"event_count":null,"data_collections":null}`), true, ""},
		{"transaction end", "shop.public.customers", []byte(`{"id":"571:53195832"}`),
			[]byte(`{"status":"END","id":"571:53195832","ts_ms":1767225600000,"event_count":2,"data_collections":[{"data_collection":"public.customers","event_count":2}]}`), true, ""},
		{"schema change", "shop.public.customers", []byte(`{"databaseName":"inventory"}`),
			[]byte(`{"source":{"ts_ms":1},"ts_ms":1,"databaseName":"inventory","schemaName":null,"ddl":"ALTER TABLE customers ADD COLUMN x int","tableChanges":[]}`), true, ""},
		{"malformed JSON", "shop.public.customers", key, []byte(`{"op":`), false, "not Debezium JSON"},
		{"binary garbage", "shop.public.customers", key, []byte{0xff, 0xfe, 0x00, 0x01}, false, "not Debezium JSON"},
		{"missing op", "shop.public.customers", key, []byte(`{` + ok + `}`), false, "no op"},
		{"unknown op", "shop.public.customers", key, []byte(`{"op":"x",` + ok + `}`), false, "unknown operation"},
		{"missing sequence", "shop.public.customers", key, []byte(`{"op":"u","after":{"customer_id":"C1"},"source":{"ts_ms":1}}`), false, "sequence path source.lsn is missing"},
		{"missing key", "shop.public.customers", nil, []byte(`{"op":"u","after":{"name":"x"},"source":{"lsn":1,"ts_ms":1}}`), false, "key column customer_id is missing"},
		{"no after", "shop.public.customers", key, []byte(`{"op":"u","source":{"lsn":1,"ts_ms":1}}`), false, "no after image"},
		{"no valid_from", "shop.public.customers", key, []byte(`{"op":"u","after":{"customer_id":"C1"},"source":{"lsn":1}}`), false, "valid_from path"},
		{"unknown topic", "other", key, []byte(`{}`), false, "no table is configured"},
		{"no key at all", "shop.public.orders", nil, []byte(`{"op":"c","after":{"a":1},"source":{"sequence":"[\"1\"]","lsn":1},"ts_ms":1}`), false, "message key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.Decode(context.Background(), origin(tc.topic), tc.key, tc.value)
			if tc.skip {
				if !errors.Is(err, ErrSkip) {
					t.Fatalf("got %v, want a skip", err)
				}
				return
			}
			if err == nil || errors.Is(err, ErrSkip) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// TestEnvelopeGetMatchesGJSON: a two-part path is read from the nested
// object's members taken once per envelope; every lookup must give what
// gjson's Get gives (first of equal names, escaped names, numbers parsed,
// more members than the envelope keeps, alternating objects).
func TestEnvelopeGetMatchesGJSON(t *testing.T) {
	var many strings.Builder
	many.WriteString(`{`)
	for i := range 40 {
		fmt.Fprintf(&many, `"f%d":%d,`, i, i*1000+7)
	}
	many.WriteString(`"last":"x"}`)
	payload := `{"before":null,"after":{"id":7,"name":"a\"b","x.y":1.5e3,"n":null,"t":true},` +
		`"source":{"version":"3.6.0.Final","name":"shop","ts_ms":1767225600000,"snapshot":"false","db":"shop","lsn":24023928,"lsn":1,"ts_ns":1767225600000000001,"w\u00e9ird":"é","sequence":"[\"1\",\"2\"]"},` +
		`"wide":` + many.String() + `,"op":"u","ts_ms":1767225600123}`
	paths := [][]string{
		{"source", "name"}, {"after", "id"}, {"source", "lsn"}, {"source", "ts_ns"}, {"source", "wéird"},
		{"source", "sequence"}, {"source", "missing"}, {"after", "x.y"}, {"after", "name"}, {"after", "n"}, {"after", "t"},
		{"wide", "f0"}, {"wide", "f23"}, {"wide", "f24"}, {"wide", "f39"}, {"wide", "last"}, {"wide", "nope"},
		{"source", "db"}, {"op"}, {"before", "id"}, {"op", "x"}, {"ts_ms"},
	}
	var env, wide jsonEnvelope
	env.read(gjson.Parse(payload), nil)
	wide.read(gjson.Parse(many.String()), nil) // more top-level fields than the envelope keeps
	for _, f := range []string{"f0", "f23", "f24", "f39", "last", "nope"} {
		if got, want := wide.get([]string{f}), gjson.Get(many.String(), f); got.Raw != want.Raw || got.Num != want.Num || got.Str != want.Str {
			t.Errorf("top-level %s = %+v, gjson gives %+v", f, got, want)
		}
	}
	for _, p := range paths {
		t.Run(strings.Join(p, "/"), func(t *testing.T) {
			got := env.get(p)
			want := gjson.Parse(payload)
			for _, k := range p {
				want = want.Get(escapePath(k))
			}
			if got.Type != want.Type || got.Raw != want.Raw || got.Str != want.Str || got.Num != want.Num || got.Exists() != want.Exists() {
				t.Errorf("get(%q) = %+v, gjson gives %+v", p, got, want)
			}
		})
	}
}
