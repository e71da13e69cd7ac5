package debezium_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/tidwall/gjson"
)

// customers is the 9-column table of FIELD_NOTES' observations of a real
// Debezium 3.6 connector, with a text of a few hundred bytes.
func customers() *scdtest.Source {
	return &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{
			{Name: "id", Schema: `{"type":"int32","optional":false,"default":0}`},
			{Name: "name", Schema: `{"type":"string","optional":true}`},
			{Name: "email", Schema: `{"type":"string","optional":true}`},
			{Name: "plan", Schema: `{"type":"string","optional":true}`},
			{Name: "balance", Schema: `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"12"}}`},
			{Name: "birth_date", Schema: `{"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1}`},
			{Name: "signed_up", Schema: `{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1}`},
			{Name: "external_id", Schema: `{"type":"string","optional":true,"name":"io.debezium.data.Uuid","version":1}`},
			{Name: "attrs", Schema: `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`},
			{Name: "bio", Schema: `{"type":"string","optional":true}`},
		}}
}

func customerRow(i int) scdtest.Row {
	return scdtest.Row{
		"id": i, "name": fmt.Sprintf("Customer %d", i), "email": fmt.Sprintf("c%d@example.com", i),
		"plan": []string{"basic", "pro", "team"}[i%3], "balance": scdtest.DecimalB64(fmt.Sprint(i*137 - 5000)),
		"birth_date":  scdtest.Days(time.Date(1950+i%60, 1, 1, 0, 0, 0, 0, time.UTC)),
		"signed_up":   scdtest.Zoned(time.Date(2024, 1, 1, 0, 0, 0, i*1000, time.UTC)),
		"external_id": fmt.Sprintf("a0eebc99-9c0b-4ef8-bb6d-%012d", i),
		"attrs":       fmt.Sprintf(`{"tier": %d, "tags": ["a", "b"], "score": 1.10}`, i%5),
		"bio":         strings.Repeat(fmt.Sprintf("Customer %d likes long walks. ", i), 10),
	}
}

// avroChanges are the changes envelopes rendered last.
var avroChanges []scdtest.Change

// envelopes renders n changes of customers: snapshot reads, updates with
// before null (default replica identity) and with a full before image.
func envelopes(n int) (src *scdtest.Source, recs [][2][]byte) {
	avroChanges = avroChanges[:0]
	src = customers()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < n; i++ {
		c := scdtest.Change{Op: "u", After: customerRow(i), LSN: int64(24023928 + 56*i), PrevLSN: int64(24023900 + 56*i),
			TxID: int64(700 + i), Commit: at.Add(time.Duration(i) * time.Millisecond)}
		switch i % 3 {
		case 0:
			c.Op, c.Snapshot, c.PrevLSN = "r", "true", 0
		case 2:
			c.Before = customerRow(i - 1)
			c.Before["id"] = i
		}
		k, v := src.Envelope(c)
		recs = append(recs, [2][]byte{k, v})
		avroChanges = append(avroChanges, c)
	}
	return src, recs
}

// BenchmarkDecode decodes real-shaped JsonConverter envelopes (schema on,
// full source block, before null and full) and, in the same run, scans the
// same bytes with a validating JSON scanner: the ratio is the decoder's
// cost over reading the bytes once. decode+row adds the typed decoding of
// the row image that the sink's Prepare does later.
func BenchmarkDecode(b *testing.B) {
	src, recs := envelopes(300)
	total := 0
	for _, r := range recs {
		total += len(r[0]) + len(r[1])
	}
	b.Logf("%d envelopes, %d bytes on average (key and value)", len(recs), total/len(recs))
	d := debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: "customers_history",
		SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, nil, nil)
	o := change.Origin{Partition: change.Partition{Topic: src.Topic()}}
	var scan, dec time.Duration
	b.Run("scan", func(b *testing.B) {
		b.SetBytes(int64(total / len(recs)))
		for i := 0; b.Loop(); i++ {
			r := recs[i%len(recs)]
			if !gjson.ValidBytes(r[0]) || !gjson.ValidBytes(r[1]) {
				b.Fatal("invalid")
			}
		}
		scan = b.Elapsed() / time.Duration(b.N)
	})
	b.Run("scan-stdlib", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			r := recs[i%len(recs)]
			if !json.Valid(r[0]) || !json.Valid(r[1]) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.SetBytes(int64(total / len(recs)))
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r := recs[i%len(recs)]
			if _, err := d.Decode(context.Background(), o, r[0], r[1]); err != nil {
				b.Fatal(err)
			}
		}
		dec = b.Elapsed() / time.Duration(b.N)
		if scan > 0 {
			b.ReportMetric(float64(dec)/float64(scan), "x-scan")
		}
	})
	// Avro: the same changes in the Confluent wire format, schemas already
	// cached (one registry fetch per id on the first records).
	reg := avroRegistry(b, src)
	da := debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: "customers_history", Format: debezium.FormatAvro,
		SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, reg, nil)
	var avro [][2][]byte
	avroBytes := 0
	for i := range recs {
		c := avroChanges[i]
		k, v := src.AvroEnvelope(c, 1, 2)
		avro = append(avro, [2][]byte{k, v})
		avroBytes += len(k) + len(v)
	}
	b.Run("avro", func(b *testing.B) {
		b.SetBytes(int64(avroBytes / len(avro)))
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r := avro[i%len(avro)]
			if _, err := da.Decode(context.Background(), o, r[0], r[1]); err != nil {
				b.Fatal(err)
			}
		}
		if scan > 0 {
			b.ReportMetric(float64(b.Elapsed()/time.Duration(b.N))/float64(scan), "x-json-scan")
		}
	})
	b.Run("json+row", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r := recs[i%len(recs)]
			ev, err := d.Decode(context.Background(), o, r[0], r[1])
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ev.DecodeAfter(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
