package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

const (
	dbSecret    = "pgS3cretXYZ"
	kafkaSecret = "kafkaS3cretXYZ"
)

// TestSecretsAndReadiness runs the service against a Kafka that requires
// SCRAM: with a wrong password it must stay not-ready and never print either
// password; with the right one it becomes ready and applies events.
func TestSecretsAndReadiness(t *testing.T) {
	t.Parallel()
	// SCRAM over TLS, with a CA made here.
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	ca, caKey := newCA(t)
	writePEM(t, caFile, "CERTIFICATE", ca.Raw)
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "shop.public.customers"),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "scd", kafkaSecret),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{issue(t, ca, caKey, "kafka", false)}}))
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()
	dsn := pgtest.NewDatabase(t)
	// The test cluster trusts local connections; the password is only carried.
	dsn = strings.Replace(dsn, "postgres@", "postgres:"+dbSecret+"@", 1)
	brokers, _ := json.Marshal(kafka.ListenAddrs())

	for _, tc := range []struct {
		name, password string
		ready          bool
	}{{"wrong password", "not-it", false}, {"right password", kafkaSecret, true}} {
		t.Run(tc.name, func(t *testing.T) {
			addr := freeAddr(t)
			cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka:
  brokers: %s
  tls: {enabled: true, ca_file: %q}
  sasl: {mechanism: SCRAM-SHA-256, username: scd}
postgres: {dsn: %q}
http: {addr: %q}
sequencer: {reorder_window: 10ms}
sink: {batch_max_wait: 10ms}
log: {level: debug}
tables:
  - topic: shop.public.customers
    keys: [customer_id]
`, brokers, caFile, dsn, addr)), func(k string) (string, bool) {
				if k == "SCD2SINK_KAFKA_SASL_PASSWORD" {
					return tc.password, true
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
			if tc.ready {
				produceOne(t, kafka.ListenAddrs(), ca)
			}
			ready := tc.ready && waitReady(addr, 10*time.Second)
			if tc.ready {
				if !ready {
					t.Errorf("never ready")
				}
				if m := waitMetric(addr, "scd2sink_events_applied_total 1", 10*time.Second); m != "" {
					t.Errorf("/metrics never showed the applied event:\n%s", m)
				}
			} else {
				time.Sleep(6 * time.Second)
				if waitReady(addr, 0) {
					t.Errorf("ready with a wrong Kafka password")
				}
			}
			cancel()
			runErr := <-done
			out := logs.String() + fmt.Sprint(runErr)
			for _, secret := range []string{dbSecret, kafkaSecret} {
				if strings.Contains(out, secret) {
					t.Fatalf("a secret was printed:\n%s", out)
				}
			}
			if !tc.ready && !strings.Contains(logs.String(), "not in the consumer group yet") {
				t.Fatalf("no warning that Kafka is not joined:\n%s", out)
			}
			if tc.ready && !strings.Contains(logs.String(), "partitions assigned") {
				t.Fatalf("no sign of work in the logs:\n%s", out)
			}
		})
	}
}

func produceOne(t *testing.T, addrs []string, ca *x509.Certificate) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.SASL(scram.Auth{User: "scd", Pass: kafkaSecret}.AsSha256Mechanism()),
		kgo.DialTLSConfig(&tls.Config{RootCAs: roots}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rec := &kgo.Record{Topic: "shop.public.customers", Key: []byte(`{"customer_id":"C1"}`),
		Value: []byte(`{"op":"c","after":{"customer_id":"C1","plan":"pro"},"source":{"lsn":1,"ts_ms":1767225600000}}`)}
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// waitMetric waits until /metrics holds line; it returns the last page
// when it never does, "" when it did.
func waitMetric(addr, line string, within time.Duration) string {
	deadline := time.Now().Add(within)
	var page string
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			page = string(body)
			if strings.Contains(page, "\n"+line+"\n") && strings.Contains(page, "scd2sink_kafka_") {
				return ""
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return page
}

func waitReady(addr string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
