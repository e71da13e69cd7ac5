package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// patternSource is a captured table of the shop connector.
func patternSource(schema, table string) *scdtest.Source {
	return &scdtest.Source{Server: "shop", DB: "shop", Schema: schema, Table: table, Keys: []string{"id"}, Cols: []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "plan", Schema: `{"type":"string","optional":true}`},
	}}
}

// producePlans writes n creates of src's table, ids from 0.
func producePlans(t *testing.T, cl *kgo.Client, src *scdtest.Source, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		k, v := src.Envelope(scdtest.Change{Op: "c", After: scdtest.Row{"id": i, "plan": "pro"}, LSN: int64(100 + i),
			Commit: time.Date(2026, 3, 1, 0, 0, i, 0, time.UTC)})
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: src.Topic(), Key: k, Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTopicPatterns: one topic_pattern entry for a whole connector. The
// topics present at start are applied to targets named from the topic;
// a table added to the connector later (its topic created while the
// service runs) is consumed within a metadata refresh, its history table
// created on its first event; Debezium's heartbeat and transaction topics
// are never read; a topic two patterns match is paused and counted, never
// applied nor dead-lettered; at start such a conflict is exit 2.
func TestTopicPatterns(t *testing.T) {
	t.Parallel()
	a, b, c := patternSource("public", "accounts"), patternSource("public", "orders"), patternSource("public", "invoices")
	both := patternSource("public", "x_paid")
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, a.Topic(), b.Topic(), "__debezium-heartbeat.shop", "shop.transaction"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	producePlans(t, cl, a, 5)
	producePlans(t, cl, b, 3)
	for _, topic := range []string{"__debezium-heartbeat.shop", "shop.transaction"} {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: []byte(`{"not":"a change"}`)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	dsn := pgtest.NewDatabase(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	addr := freeAddr(t)
	yaml := fmt.Sprintf(`
kafka: {brokers: %s, metadata_max_age: 500ms}
postgres: {dsn: %q}
http: {addr: %q}
sequencer: {reorder_window: 10ms}
sink: {batch_max_wait: 10ms}
tables:
  - topic_pattern: 'shop\.public\..*'
    target: "{table}_hist"
  - topic_pattern: 'shop\.public\.x_.*'
`, brokers, dsn, addr)
	cfg, err := config.Parse([]byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, Options{Logger: zaptest.NewLogger(t)}) }()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	count := func(table string) int {
		var n int
		if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %s`, table)).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	waitRows := func(table string, n int, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < within {
			if count(table) == n {
				return time.Since(start)
			}
			select {
			case err := <-done:
				t.Fatalf("Run ended: %v", err)
			default:
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s holds %d rows, want %d", table, count(table), n)
		return 0
	}
	waitRows("accounts_hist", 5, 30*time.Second)
	waitRows("orders_hist", 3, 10*time.Second)

	// A table added to the connector: its topic appears while we run.
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(context.Background(), 1, 1, nil, c.Topic()); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreateTopic(context.Background(), 1, 1, nil, both.Topic()); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	producePlans(t, cl, c, 4)
	producePlans(t, cl, both, 2)
	waitRows("invoices_hist", 4, 30*time.Second)
	t.Logf("a topic created while running was applied %v after it was created (metadata_max_age 500ms)", time.Since(created).Round(time.Millisecond))
	producePlans(t, cl, a, 7) // ids 5, 6 are new
	waitRows("accounts_hist", 7, 10*time.Second)
	skipped := false
	for deadline := time.Now().Add(10 * time.Second); !skipped && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		skipped = metricHas(addr, `scd2sink_topics_skipped_total{topic="shop.public.x_paid"} 1`)
	}
	if !skipped {
		t.Error("the topic matched by two patterns was not counted as skipped")
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM scd2sink_watermarks WHERE complete_through IS NOT NULL`).Scan(&n)
		if n == 3 {
			break
		}
	}
	if code, body := getReadyz(addr); code != http.StatusOK {
		t.Errorf("/readyz %d: %s", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	var tables, dead int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM pg_tables WHERE tablename LIKE '%\_hist'),
		(SELECT count(*) FROM scd2sink_dead_letters)`).Scan(&tables, &dead); err != nil {
		t.Fatal(err)
	}
	if tables != 3 || dead != 0 {
		t.Errorf("%d history tables (want accounts, orders, invoices), %d dead letters", tables, dead)
	}
	var offsets int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM scd2sink_offsets WHERE topic NOT LIKE 'shop.public.%' OR topic = 'shop.public.x_paid'`).Scan(&offsets); err != nil {
		t.Fatal(err)
	}
	if offsets != 0 {
		t.Errorf("%d offsets recorded for topics never applied", offsets)
	}

	// scd2sink tables: every matched topic, its target, keys, versions,
	// lag and watermark; the skipped one with why.
	var out strings.Builder
	if err := Tables(context.Background(), cfg, Options{}, &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("scd2sink tables:\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "topic") {
		t.Fatalf("want a header and 4 topics:\n%s", out.String())
	}
	for _, want := range []string{`shop.public.accounts\s+accounts_hist\s+id\s+\(all\)\s+7\s+0\s+20\d\d-`,
		`shop.public.invoices\s+invoices_hist\s+id\s+\(all\)\s+4\s+0\s`,
		`shop.public.x_paid\s+-\s+skipped: topic shop.public.x_paid matches both`} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("no line matches %s", want)
		}
	}

	// Restarted, the conflict among the topics now in Kafka is exit 2.
	err = Run(context.Background(), cfg, Options{Logger: zap.NewNop()})
	var ce *config.Error
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "shop.public.x_paid matches both") {
		t.Fatalf("restart with a conflict: %v, want a configuration error", err)
	}
}
