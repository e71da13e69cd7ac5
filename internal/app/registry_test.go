package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"go.uber.org/zap"
)

// registryCase runs the service over n Avro records whose schemas sit in
// reg, reached through serve (which may misbehave), with extra config
// under schema_registry; it checks that every record is applied and none
// is a dead letter, and returns what /readyz said while it waited.
func registryCase(t *testing.T, reg *srfake.Registry, url string, extra string, n int) (notReady string) {
	t.Helper()
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "plans", Keys: []string{"id"}, Cols: []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "plan", Schema: `{"type":"string","optional":true}`},
	}}
	reg.SeedSchema(src.Topic()+"-value", 1, 21, sr.Schema{Schema: src.AvroValueSchema(), Type: sr.TypeAvro})
	reg.SeedSchema(src.Topic()+"-key", 1, 22, sr.Schema{Schema: src.AvroKeySchema(), Type: sr.TypeAvro})
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, src.Topic()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for i := 0; i < n; i++ {
		k, v := src.AvroEnvelope(scdtest.Change{Op: "c", After: scdtest.Row{"id": i, "plan": "pro"}, LSN: int64(100 + i),
			Commit: time.Date(2026, 3, 1, 0, 0, i, 0, time.UTC)}, 21, 22)
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: src.Topic(), Key: k, Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	dsn := pgtest.NewDatabase(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	addr := freeAddr(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: %q}
schema_registry:
  url: %q
%s
sequencer: {reorder_window: 10ms}
sink: {batch_max_wait: 10ms}
tables:
  - topic: %s
    target: plans_history
    format: debezium-avro
`, brokers, dsn, addr, url, extra, src.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, Options{Logger: zap.NewNop()}) }()
	deadline := time.Now().Add(40 * time.Second)
	for time.Now().Before(deadline) {
		if code, body := getReadyz(addr); code == http.StatusServiceUnavailable && strings.Contains(body, "wait") && notReady == "" {
			notReady = body
		}
		if metricHas(addr, fmt.Sprintf("scd2sink_events_applied_total %d", n)) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var versions, dead int
	var why string
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM plans_history), count(*), coalesce(max(error), '') FROM scd2sink_dead_letters`).Scan(&versions, &dead, &why); err != nil {
		t.Fatalf("reading the result (was the table ever created?): %v", err)
	}
	if versions != n || dead != 0 {
		t.Errorf("%d versions of %d records, %d dead letters (%s)", versions, n, dead, why)
	}
	return notReady
}

func metricHas(addr, line string) bool {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(body), "\n"+line+"\n")
}

func getReadyz(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestRegistryHiccups: what is not a record's fault never makes it a dead
// letter. A registry follower that answers 40403 for a just-registered id
// for its first seconds, and a registry that is down (connections cut)
// for 10 s: the records wait, /readyz says why, and all are applied.
func TestRegistryHiccups(t *testing.T) {
	t.Run("40403 for the first 4s", func(t *testing.T) {
		reg := srfake.New()
		t.Cleanup(reg.Close)
		start := time.Now()
		var misses atomic.Int64
		reg.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
			if strings.Contains(r.URL.Path, "/schemas/ids/") && time.Since(start) < 4*time.Second {
				misses.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				_, _ = w.Write([]byte(`{"error_code":40403,"message":"Schema 21 not found"}`))
				return true
			}
			return false
		})
		why := registryCase(t, reg, reg.URL(), "", 6)
		if !strings.Contains(why, "schema id") {
			t.Errorf("/readyz never said the records wait for a schema id: %q", why)
		}
		if m := misses.Load(); m > 60 {
			t.Errorf("%d lookups in 4 s for one id: misses are not paced", m)
		}
		t.Logf("registry asked %d times while it did not know the id; /readyz: %s", misses.Load(), why)
	})
	t.Run("down for 10s", func(t *testing.T) {
		reg := srfake.New()
		t.Cleanup(reg.Close)
		start := time.Now()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if time.Since(start) < 10*time.Second {
				if hj, ok := w.(http.Hijacker); ok {
					conn, _, _ := hj.Hijack()
					conn.Close() // a connection cut, as from a registry that is down
					return
				}
			}
			reg.Handler().ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		why := registryCase(t, reg, srv.URL, "", 6)
		if why == "" {
			t.Errorf("/readyz never said the records wait")
		}
		if took := time.Since(start); took < 10*time.Second {
			t.Errorf("applied after %v, while the registry was down", took)
		}
	})
}

// TestRegistryTLSAndToken: the registry over mutual TLS with a CA made
// here, and a bearer token read from token_file (basic auth off).
func TestRegistryTLSAndToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, caKey := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	serverCert := issue(t, ca, caKey, "registry", false)
	clientCert := issue(t, ca, caKey, "scd2sink", true)
	writePEM(t, filepath.Join(dir, "client.pem"), "CERTIFICATE", clientCert.Certificate[0])
	keyDER, err := x509.MarshalECPrivateKey(clientCert.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "client.key"), "EC PRIVATE KEY", keyDER)
	const token = "tok-3f9a"
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := srfake.New(srfake.WithAuth("Bearer " + token))
	t.Cleanup(reg.Close)
	var clients atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && r.TLS.PeerCertificates[0].Subject.CommonName == "scd2sink" {
			clients.Add(1)
		}
		reg.Handler().ServeHTTP(w, r)
	}))
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	registryCase(t, reg, srv.URL, fmt.Sprintf("  token_file: %q\n  tls: {ca_file: %q, cert_file: %q, key_file: %q}",
		filepath.Join(dir, "token"), filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")), 3)
	if clients.Load() == 0 {
		t.Errorf("no request presented the client certificate")
	}
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "scd2sink test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

// issue makes a certificate signed by ca: for 127.0.0.1 (a server) or a
// client.
func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, client bool) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	if client {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestOAuthBearerTokenFile: kfake has no OAUTHBEARER, so the mechanism
// kafkaSASL builds is driven directly: its first client message carries
// the token from token_file, and a token rotated in the file is used for
// the next connection without a restart.
func TestOAuthBearerTokenFile(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{Kafka: config.Kafka{SASL: config.SASL{Mechanism: "OAUTHBEARER", TokenFile: file}}}
	mech := kafkaSASL(cfg)
	if mech == nil || mech.Name() != "OAUTHBEARER" {
		t.Fatalf("mechanism %v", mech)
	}
	first := func() string {
		_, msg, err := mech.Authenticate(context.Background(), "broker:9093")
		if err != nil {
			t.Fatal(err)
		}
		return string(msg)
	}
	if m := first(); !strings.Contains(m, "auth=Bearer first-token\x01") {
		t.Fatalf("first message %q", m)
	}
	time.Sleep(10 * time.Millisecond) // a later modification time
	if err := os.WriteFile(file, []byte("rotated-token-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if m := first(); !strings.Contains(m, "auth=Bearer rotated-token-2\x01") {
		t.Fatalf("after rotation %q", m)
	}
	cfg.Kafka.SASL = config.SASL{Mechanism: "AWS_MSK_IAM", AWSRegion: "eu-central-1"}
	if m := kafkaSASL(cfg); m == nil || m.Name() != "AWS_MSK_IAM" {
		t.Fatalf("AWS_MSK_IAM mechanism %v", m)
	}
}
