package app

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// `scd2sink init` on a cluster holding topics of two connectors in JSON and
// Avro, besides a transaction-metadata topic, a schema-change topic and an
// empty one: it writes a configuration that passes run's validation (one
// topic_pattern for the two tables of one prefix, the MariaDB and the Avro
// topics on their own), and that configuration, run as it is, builds the
// same history as one written by hand.
func TestInit(t *testing.T) {
	t.Parallel()
	cols := []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "plan", Schema: `{"type":"string","optional":true}`},
		{Name: "qty", Schema: `{"type":"int32","optional":true}`},
	}
	customers := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"}, Cols: cols}
	orders := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "orders", Keys: []string{"id"}, Cols: cols}
	accounts := &scdtest.Source{Server: "inv", DB: "inv", Table: "accounts", Keys: []string{"id"}, Cols: cols}
	items := &scdtest.Source{Server: "cat", DB: "cat", Schema: "public", Table: "items", Keys: []string{"id"}, Cols: cols}
	// A table of the name of one the pattern takes: its target must differ.
	oldCustomers := &scdtest.Source{Server: "old", DB: "old", Schema: "public", Table: "customers", Keys: []string{"id"}, Cols: cols}
	reg := srfake.New()
	t.Cleanup(reg.Close)
	reg.SeedSchema(items.Topic()+"-value", 1, 21, sr.Schema{Schema: items.AvroValueSchema(), Type: sr.TypeAvro})
	reg.SeedSchema(items.Topic()+"-key", 1, 22, sr.Schema{Schema: items.AvroKeySchema(), Type: sr.TypeAvro})
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, customers.Topic(), orders.Topic(), oldCustomers.Topic(), accounts.MariaDBTopic(),
		items.Topic(), "shop.transaction", "inv", "empty.topic", "__debezium-heartbeat.shop"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	at := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	var recs []*kgo.Record
	n := 0
	for i, c := range []scdtest.Change{
		{Op: "c", After: scdtest.Row{"id": 1, "plan": "basic", "qty": 1}},
		{Op: "u", After: scdtest.Row{"id": 1, "plan": "pro", "qty": 1}},
		{Op: "c", After: scdtest.Row{"id": 2, "plan": "team", "qty": 2}},
		{Op: "d", Before: scdtest.Row{"id": 1}},
	} {
		c.LSN, c.Commit = int64(100+10*i), at.Add(time.Duration(i)*time.Minute)
		for _, s := range []*scdtest.Source{customers, orders, oldCustomers} {
			k, v := s.Envelope(c)
			recs = append(recs, &kgo.Record{Topic: s.Topic(), Key: k, Value: v})
		}
		k, v := accounts.MariaDBEnvelope(c, scdtest.Binlog{GTID: fmt.Sprintf("0-1-%d", 5+i), File: "mysql-bin.000002", Pos: int64(400 + 100*i), ServerID: 1})
		recs = append(recs, &kgo.Record{Topic: accounts.MariaDBTopic(), Key: k, Value: v})
		k, v = items.AvroEnvelope(c, 21, 22)
		recs = append(recs, &kgo.Record{Topic: items.Topic(), Key: k, Value: v})
		n += 5
	}
	recs = append(recs,
		&kgo.Record{Topic: "shop.transaction", Key: []byte(`{"id":"571"}`), Value: []byte(`{"status":"BEGIN","id":"571","ts_ms":1772355600000,"event_count":null,"data_collections":null}`)},
		&kgo.Record{Topic: "inv", Key: []byte(`{"databaseName":"inv"}`), Value: []byte(`{"source":{"connector":"mariadb"},"databaseName":"inv","ddl":"CREATE TABLE accounts (id INT)","tableChanges":[]}`)})
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	genDSN := pgtest.NewDatabase(t)
	if err := Init(context.Background(), InitOptions{Brokers: kafka.ListenAddrs(), Registry: reg.URL(), DSN: genDSN, Wait: 2 * time.Second}, &out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{`topic_pattern: "shop\\.public\\.[^.]+"`, `- topic: "inv.inv.accounts"`, "connector: mariadb",
		"sequence_by: [source.gtid, source.file, source.pos, source.row]", `- topic: "cat.public.items"`, "format: debezium-avro",
		`- topic: "old.public.customers"`, `target: "old_public_customers_history"`,
		"kind: confluent", `track_history: ["plan", "qty"]`, `keys: ["id"]`,
		"Left out: shop.transaction: transaction", `transaction_topic: "shop.transaction"`, "Left out: inv: schema-change", "Left out: empty.topic: no record"} {
		if !strings.Contains(text, want) {
			t.Errorf("the configuration lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "heartbeat") {
		t.Errorf("an internal topic is named:\n%s", text)
	}

	// Run as it is, and by hand: the same history.
	handDSN := pgtest.NewDatabase(t)
	hand := fmt.Sprintf(`kafka: {brokers: %q}
postgres: {dsn: %q}
schema_registry: {url: %q}
tables:
  - {topic: shop.public.customers, target: customers_history}
  - {topic: shop.public.orders, target: orders_history}
  - {topic: old.public.customers, target: old_public_customers_history}
  - {topic: inv.inv.accounts, target: accounts_history, connector: mariadb}
  - {topic: cat.public.items, target: items_history, format: debezium-avro}
`, kafka.ListenAddrs(), handDSN, reg.URL())
	histories := map[string][]string{}
	for _, run := range []struct{ name, yaml, dsn string }{{"init", text, genDSN}, {"hand", hand, handDSN}} {
		cfg, err := config.Parse([]byte("http: {addr: \"\"}\nsequencer: {reorder_window: 10ms}\nsink: {batch_max_wait: 10ms}\n"+run.yaml),
			func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatalf("%s: %v", run.name, err)
		}
		cfg.Kafka.GroupID = "scd2sink-" + run.name
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Run(ctx, cfg, Options{Logger: zap.NewNop()}) }()
		pool, err := pgxpool.New(context.Background(), run.dsn)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			var applied int64
			err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets`).Scan(&applied)
			if err == nil && applied >= int64(n) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d records applied within 30 s (%v)", run.name, applied, n, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("%s: Run: %v", run.name, err)
		}
		for _, target := range []string{"customers_history", "orders_history", "old_public_customers_history", "accounts_history", "items_history"} {
			lines := scdtest.HistoryLines(t, pool, sink.TableSpec{Target: target, Schema: "public", Keys: []string{"id"}}, []string{"plan", "qty"})
			histories[run.name] = append(histories[run.name], target)
			histories[run.name] = append(histories[run.name], withoutSeq(lines)...)
		}
		pool.Close()
	}
	if d := scdtest.DiffLines(histories["hand"], histories["init"]); d != "" || len(histories["init"]) < 5*4 {
		t.Errorf("init's configuration builds another history than the hand-written one:\n%s", d)
	}
}

// A table ordered by MySQL's binlog positions alone (connector: mysql's
// default) is warned of at start; one with a failover-safe sequence is not.
func TestWarnPositionOnly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		extra string
		warns bool
	}{{"", true}, {"\n    sequence_by: [source.ts_us, source.file, source.pos, source.row]", false}} {
		cfg, err := config.Parse([]byte(`kafka: {brokers: ["127.0.0.1:9092"]}
postgres: {dsn: "postgres://u@127.0.0.1:5432/db"}
tables:
  - topic: inv.inv.accounts
    connector: mysql`+tc.extra+"\n"), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		core, logs := observer.New(zap.WarnLevel)
		warnPositionOnly(cfg, zap.New(core))
		if got := logs.FilterMessageSnippet("binlog positions only").Len() == 1; got != tc.warns {
			t.Errorf("sequence_by %q: warned %v, want %v", tc.extra, got, tc.warns)
		}
	}
}
