package debezium

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// TestTransactionRecord: BEGIN and END records of a transaction topic as
// the JsonConverter (with and without schemas) and the AvroConverter
// write them; what is not one is an error, a tombstone is skipped.
func TestTransactionRecord(t *testing.T) {
	reg := srfake.New()
	t.Cleanup(reg.Close)
	reg.SeedSchema("shop.transaction-value", 1, 31, sr.Schema{Schema: scdtest.AvroTransactionSchema, Type: sr.TypeAvro})
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	d := New(nil, cl, nil)
	at := time.Date(2026, 3, 1, 9, 0, 0, 123e6, time.UTC)
	counts := map[string]int64{"public.checking": 2, "public.savings": 1}
	_, withSchema := scdtest.TransactionRecord("571:53195832", at, counts)
	_, begin := scdtest.TransactionRecord("571:53195832", at, nil)
	for _, tc := range []struct {
		name   string
		value  []byte
		status string
		counts map[string]int64
	}{
		{"json END with schema", withSchema, "END", counts},
		{"json BEGIN with schema", begin, "BEGIN", nil},
		{"json END without schema", []byte(`{"status":"END","id":"571:53195832","event_count":3,"data_collections":[{"data_collection":"public.checking","event_count":2},{"data_collection":"public.savings","event_count":1}],"ts_ms":1772355600123}`), "END", counts},
		{"avro END", scdtest.AvroTransactionRecord("571:53195832", at, counts, 31), "END", counts},
		{"avro BEGIN", scdtest.AvroTransactionRecord("571:53195832", at, nil, 31), "BEGIN", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := d.TransactionRecord(context.Background(), tc.value)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != tc.status || r.ID != "571:53195832" || !r.Commit.Equal(at) {
				t.Fatalf("got %+v", r)
			}
			if len(r.Counts) != len(tc.counts) {
				t.Fatalf("counts %v, want %v", r.Counts, tc.counts)
			}
			for n, c := range tc.counts {
				if r.Counts[n] != c {
					t.Fatalf("counts %v, want %v", r.Counts, tc.counts)
				}
			}
		})
	}
	for _, bad := range []string{`{"status":"COMMIT","id":"1","ts_ms":1}`, `{"status":"END","id":"1"}`, `{"status":"END","ts_ms":1}`, `{"status":`} {
		if _, err := d.TransactionRecord(context.Background(), []byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if _, err := d.TransactionRecord(context.Background(), nil); !errors.Is(err, ErrSkip) {
		t.Errorf("a tombstone: %v", err)
	}
}

// TestTransactionMarks: a data event of a table with a transaction topic
// carries its place in its transaction (PostgreSQL's id without the
// record's own LSN, the END's name of its table, its total order), JSON
// and Avro alike; a table without one reads no transaction block.
func TestTransactionMarks(t *testing.T) {
	src := avroSource()
	reg := srfake.New()
	t.Cleanup(reg.Close)
	reg.SeedSchema(src.Topic()+"-value", 1, 7, sr.Schema{Schema: src.AvroValueSchema(), Type: sr.TypeAvro})
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := scdtest.Change{Op: "c", After: scdtest.Row{"id": 1, "plan": "pro"}, LSN: 10, Commit: at,
		Txn: &scdtest.TxnBlock{ID: "571:53195832", TotalOrder: 3, DataCollectionOrder: 2}}
	_, jsonValue := src.Envelope(c)
	_, avroValue := src.AvroEnvelope(c, 7, 0)
	want := change.TxnMark{Topic: "shop.transaction", ID: "571", Collection: "public.customers", Order: 3}
	for _, tc := range []struct {
		format string
		value  []byte
	}{{FormatJSON, jsonValue}, {FormatAvro, avroValue}} {
		t.Run(tc.format, func(t *testing.T) {
			rule := Rule{Topic: src.Topic(), Target: "customers_history", Format: tc.format, SequenceBy: []string{"source.lsn"},
				ValidFrom: "source.ts_ms", Connector: "postgresql"}
			o := change.Origin{Partition: change.Partition{Topic: src.Topic()}}
			key, _ := src.Envelope(c)
			ev, err := New([]Rule{rule}, cl, nil).Decode(context.Background(), o, key, tc.value)
			if err != nil || ev.Txn != nil {
				t.Fatalf("without transaction_topic: %v %+v", err, ev.Txn)
			}
			rule.TransactionTopic = "shop.transaction"
			ev, err = New([]Rule{rule}, cl, nil).Decode(context.Background(), o, key, tc.value)
			if err != nil {
				t.Fatal(err)
			}
			if ev.Txn == nil || *ev.Txn != want {
				t.Fatalf("mark %+v, want %+v", ev.Txn, want)
			}
		})
	}
	for _, tc := range []struct{ connector, db, schema, table, want string }{
		{"postgresql", "shop", "public", "orders", "public.orders"},
		{"mysql", "inventory", "", "customers", "inventory.customers"},
		{"mariadb", "inventory", "", "customers", "inventory.customers"},
		{"sqlserver", "testDB", "dbo", "customers", "testDB.dbo.customers"},
		{"oracle", "ORCLPDB1", "DEBEZIUM", "CUSTOMERS", "ORCLPDB1.DEBEZIUM.CUSTOMERS"},
		{"mongodb", "inventory", "", "orders", "inventory.orders"},
	} {
		if got := Collection(tc.connector, tc.db, tc.schema, tc.table); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.connector, got, tc.want)
		}
	}
	if got := TransactionID("mysql", "a1b2:17"); got != "a1b2:17" {
		t.Errorf("a MySQL GTID was cut: %s", got)
	}
}
