package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"
)

// TestReadyzNamesTheSideDown: with every broker gone /readyz says that
// Kafka is unreachable and why, in a line of its own, and names no side
// that is up; when a broker listens again it is ready again.
func TestReadyzNamesTheSideDown(t *testing.T) {
	t.Parallel()
	src := patternSource("public", "accounts")
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, src.Topic()), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	brokers := kafka.ListenAddrs()
	addr := freeAddr(t)
	raw, _ := json.Marshal(brokers)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, session_timeout: 2s}
postgres: {dsn: %q}
http: {addr: %q}
shutdown_timeout: 2s
tables: [{topic: %s, target: accounts_history}]
`, raw, pgtest.NewDatabase(t), addr, src.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// No test logger: the Kafka client may log a failed dial while it closes.
	go func() { done <- Run(ctx, cfg, Options{Logger: zap.NewNop()}) }()
	t.Cleanup(func() { cancel(); <-done })
	if !waitReady(addr, 30*time.Second) {
		_, body := getReadyz(addr)
		t.Fatalf("never ready: %s", body)
	}
	kafka.Close()
	var body string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var code int
		code, body = getReadyz(addr)
		if code == http.StatusServiceUnavailable && strings.Contains(body, "Kafka unreachable: cannot connect to broker "+brokers[0]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never said Kafka is unreachable: %q", body)
		}
	}
	if strings.Contains(body, "PostgreSQL") || strings.Contains(body, "kafka=") {
		t.Errorf("/readyz names a side that is up, or in Go's words: %q", body)
	}
}
