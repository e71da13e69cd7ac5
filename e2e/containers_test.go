package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/app"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPipelineInContainers runs scd2sink against Apache Kafka and
// PostgreSQL in Docker through testcontainers-go, fed with envelopes shaped
// as Debezium writes them, where a Docker engine answers; without one it
// skips (CI has none: `make e2e` runs the whole real stack, Debezium
// included, from Maven Central's jars and the local PostgreSQL binaries).
// PostgreSQL comes from the PostgreSQL module; Kafka from the apache/kafka
// image as a generic container, because the Go module proxy serves no
// Kafka module matching testcontainers-go v0.45.0.
func TestPipelineInContainers(t *testing.T) {
	testcontainers.SkipIfProviderIsNotHealthy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	kc, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{Started: true,
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        "apache/kafka:4.1.0",
			ExposedPorts: []string{fmt.Sprintf("%d:9092/tcp", port)},
			Env: map[string]string{
				"KAFKA_NODE_ID": "1", "KAFKA_PROCESS_ROLES": "broker,controller",
				"KAFKA_LISTENERS":                        "PLAINTEXT://:9092,CONTROLLER://:9093",
				"KAFKA_ADVERTISED_LISTENERS":             fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", port),
				"KAFKA_CONTROLLER_LISTENER_NAMES":        "CONTROLLER",
				"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":   "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
				"KAFKA_CONTROLLER_QUORUM_VOTERS":         "1@localhost:9093",
				"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
				"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1", "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
			},
			WaitingFor: wait.ForListeningPort("9092/tcp").WithStartupTimeout(2 * time.Minute),
		}})
	testcontainers.CleanupContainer(t, kc)
	if err != nil {
		t.Fatalf("starting Kafka: %v", err)
	}
	brokers := []string{fmt.Sprintf("127.0.0.1:%d", port)}
	pg, err := tcpostgres.Run(ctx, "postgres:16-alpine", tcpostgres.WithDatabase("warehouse"),
		tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"), tcpostgres.BasicWaitStrategies())
	testcontainers.CleanupContainer(t, pg)
	if err != nil {
		t.Fatalf("starting PostgreSQL: %v", err)
	}
	dsn, err := pg.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}

	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`},
			{Name: "plan", Schema: `{"type":"string","optional":true}`},
			{Name: "balance", Schema: `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2"}}`}}}
	at := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i, c := range []scdtest.Change{
		{Op: "c", After: scdtest.Row{"id": 1, "plan": "basic", "balance": scdtest.DecimalB64("1050")}, LSN: 100},
		{Op: "u", After: scdtest.Row{"id": 1, "plan": "pro", "balance": scdtest.DecimalB64("1050")}, LSN: 200},
		{Op: "c", After: scdtest.Row{"id": 2, "plan": "team", "balance": scdtest.DecimalB64("-1")}, LSN: 300},
	} {
		c.Commit = at.Add(time.Duration(i) * time.Hour)
		k, v := src.Envelope(c)
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: src.Topic(), Key: k, Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(brokers)
	cfg, err := config.Parse([]byte(fmt.Sprintf("kafka: {brokers: %s}\npostgres: {dsn: %q}\nhttp: {addr: \"\"}\n"+
		"sequencer: {reorder_window: 50ms}\nsink: {batch_max_wait: 50ms}\ntables:\n  - topic: %s\n    target: customers_history\n",
		b, dsn, src.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- app.Run(runCtx, cfg, app.Options{}) }()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const want = "1:basic:10.50:f 1:pro:10.50:t 2:team:-0.01:t"
	var got string
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline) && got != want; time.Sleep(200 * time.Millisecond) {
		_ = pool.QueryRow(ctx, `SELECT string_agg(concat_ws(':', id, plan, balance, is_current), ' ' ORDER BY id, valid_from) FROM customers_history`).Scan(&got)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("scd2sink: %v", err)
	}
	if got != want {
		t.Fatalf("history %q, want %q", got, want)
	}
}
