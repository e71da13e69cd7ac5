package app

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const registrySecret = "srS3cretXYZ"

// The service end to end with both formats: the same changes as
// JsonConverter envelopes (schemas on) and as Avro through a Schema
// Registry behind basic auth, a primary-key change among them (headers
// included), give the same typed history.
func TestFormatsThroughTheService(t *testing.T) {
	t.Parallel()
	cols := []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "plan", Schema: `{"type":"string","optional":true}`},
		{Name: "balance", Schema: `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}}`},
		{Name: "birth", Schema: `{"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1}`},
		{Name: "attrs", Schema: `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`},
		{Name: "bio", Schema: `{"type":"string","optional":true}`},
	}
	jsonSrc := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"}, Cols: cols}
	avroSrc := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers_avro", Keys: []string{"id"}, Cols: cols}
	reg := srfake.New(srfake.WithAuth("Basic " + base64.StdEncoding.EncodeToString([]byte("scd:"+registrySecret))))
	defer reg.Close()
	reg.SeedSchema(avroSrc.Topic()+"-value", 1, 11, sr.Schema{Schema: avroSrc.AvroValueSchema(), Type: sr.TypeAvro})
	reg.SeedSchema(avroSrc.Topic()+"-key", 1, 12, sr.Schema{Schema: avroSrc.AvroKeySchema(), Type: sr.TypeAvro})
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, jsonSrc.Topic(), avroSrc.Topic()))
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()

	at := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	row := func(id int, plan, bio string) scdtest.Row {
		return scdtest.Row{"id": id, "plan": plan, "balance": scdtest.DecimalB64("-1050"), "birth": scdtest.Days(time.Date(1969, 7, 20, 0, 0, 0, 0, time.UTC)),
			"attrs": `{"n": 12345678901234567890, "x": 1.10}`, "bio": bio}
	}
	changes := []scdtest.Change{
		{Op: "r", After: row(1, "basic", "long bio"), LSN: 100, Snapshot: "true"},
		{Op: "u", After: row(1, "pro", "__debezium_unavailable_value"), LSN: 110},
		{Op: "d", Before: scdtest.Row{"id": 1}, LSN: 120},
		{Op: "c", After: row(2, "pro", "__debezium_unavailable_value"), LSN: 121},
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i, c := range changes {
		c.Commit = at.Add(time.Duration(i) * time.Hour)
		var hdrs []kgo.RecordHeader
		switch c.LSN {
		case 120:
			hdrs = []kgo.RecordHeader{{Key: debezium.NewKeyHeader, Value: []byte(`{"id":2}`)}}
		case 121:
			hdrs = []kgo.RecordHeader{{Key: debezium.OldKeyHeader, Value: []byte(`{"id":1}`)}}
		}
		jk, jv := jsonSrc.Envelope(c)
		ak, av := avroSrc.AvroEnvelope(c, 11, 12)
		recs := []*kgo.Record{{Topic: jsonSrc.Topic(), Key: jk, Value: jv, Headers: hdrs}, {Topic: avroSrc.Topic(), Key: ak, Value: av, Headers: hdrs}}
		if c.Op == "d" { // the tombstones
			recs = append(recs, &kgo.Record{Topic: jsonSrc.Topic(), Key: jk}, &kgo.Record{Topic: avroSrc.Topic(), Key: ak})
		}
		if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	dsn := pgtest.NewDatabase(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	addr := freeAddr(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, sasl: {allow_plaintext: true}} # the test registry is plain http
postgres: {dsn: %q}
http: {addr: %q}
schema_registry: {url: %q, username: scd}
sequencer: {reorder_window: 10ms}
sink: {batch_max_wait: 10ms}
tables:
  - topic: %s
    target: customers_history
  - topic: %s
    target: customers_avro_history
    format: debezium-avro
`, brokers, dsn, addr, reg.URL(), jsonSrc.Topic(), avroSrc.Topic())), func(k string) (string, bool) {
		if k == "SCD2SINK_SCHEMA_REGISTRY_PASSWORD" {
			return registrySecret, true
		}
		return "", false
	})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&logs), zap.DebugLevel))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, Options{Logger: log}) }()
	if m := waitMetric(addr, "scd2sink_events_applied_total 8", 20*time.Second); m != "" {
		t.Errorf("not all 8 events applied:\n%s", m)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if strings.Contains(logs.String(), registrySecret) {
		t.Fatal("the registry password was printed")
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	want := "1|basic|-10.50|1969-07-20|{\"n\": 12345678901234567890, \"x\": 1.10}|long bio|f " +
		"1|pro|-10.50|1969-07-20|{\"n\": 12345678901234567890, \"x\": 1.10}|long bio|f " +
		"2|pro|-10.50|1969-07-20|{\"n\": 12345678901234567890, \"x\": 1.10}|long bio|t"
	for _, table := range []string{"customers_history", "customers_avro_history"} {
		var got, types string
		if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT string_agg(concat_ws('|', id, plan, balance, birth, attrs, bio, is_current), ' ' ORDER BY id, scd_seq),
			(SELECT string_agg(format_type(atttypid, atttypmod), ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = '%[1]s'::regclass AND attnum BETWEEN 1 AND 6)
			FROM %[1]s`, table)).Scan(&got, &types); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s:\n got %s\nwant %s", table, got, want)
		}
		if types != "integer,text,numeric,date,jsonb,text" {
			t.Errorf("%s column types %s", table, types)
		}
	}
}
