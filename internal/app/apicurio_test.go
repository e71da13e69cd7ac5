package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// fakeApicurio serves Apicurio Registry's v2 and v3 ids endpoints (the
// schema's text, 404 with Apicurio's error body when unknown) behind a
// credential, from maps of global and content ids. A request under any
// other prefix is a 404, as from a wrong path.
type fakeApicurio struct {
	global, content map[int64]string
	auth            string        // the Authorization header required
	unknownFor      time.Duration // ids answer 404 for this long from the first lookup (a replica behind)
	start           time.Time
	once            sync.Once
	asked           atomic.Int64
}

func (f *fakeApicurio) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != f.auth {
		http.Error(w, `{"error_code":401,"message":"Unauthorized"}`, http.StatusUnauthorized)
		return
	}
	notFound := func(what string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error_code":404,"message":"No %s was found."}`, what)
	}
	var api string
	for _, p := range []string{"/apis/registry/v2", "/apis/registry/v3"} {
		if strings.HasPrefix(r.URL.Path, p+"/") {
			api = p
		}
	}
	if api == "" {
		http.NotFound(w, r)
		return
	}
	rest := strings.TrimPrefix(r.URL.Path, api)
	if rest == "/system/info" {
		_, _ = w.Write([]byte(`{"name":"Apicurio Registry (In Memory)","version":"2.4.2.Final"}`))
		return
	}
	var id int64
	var kind string
	if _, err := fmt.Sscanf(rest, "/ids/%s", &kind); err != nil {
		http.NotFound(w, r)
		return
	}
	kind, num, _ := strings.Cut(kind, "/")
	if _, err := fmt.Sscan(num, &id); err != nil {
		http.NotFound(w, r)
		return
	}
	f.asked.Add(1)
	// Behind from the first lookup, not from the test's start: on a busy
	// machine the group may take longer than unknownFor to join.
	f.once.Do(func() { f.start = time.Now() })
	m := map[string]map[int64]string{"globalIds": f.global, "contentIds": f.content}[kind]
	s, ok := m[id]
	if !ok || time.Since(f.start) < f.unknownFor {
		notFound(fmt.Sprintf("artifact with %s %d", kind, id))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(s))
}

// TestApicurio runs the service over Debezium changes in Avro as
// Apicurio's converter writes them, in each of its framings, against a
// registry speaking Apicurio's API: the history is exact and nothing is a
// dead letter. The content ids and global ids overlap on purpose (global
// 1 is the key schema, content 1 the value schema, and so on), so that
// asking for one kind of id instead of the other decodes nothing.
func TestApicurio(t *testing.T) {
	t.Parallel()
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "plans", Keys: []string{"id"}, Cols: []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "plan", Schema: `{"type":"string","optional":true}`},
	}}
	dir := t.TempDir()
	const token = "apicurio-tok"
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		framing   string // headers | wire8 | wire4
		useID     string // what the records carry: globalId | contentId
		path      string // appended to the server's URL
		auth      string // extra config lines
		authHdr   string
		unknown   time.Duration
		wantReady string // what /readyz says while records wait
		applied   bool
		bad       bool // one more record, whose id header is cut short: a dead letter keeping its headers
	}{
		{name: "headers, global ids (the converter's default), v2 API, basic auth, a replica behind for 4 s",
			framing: "headers", useID: "globalId", path: "/apis/registry/v2", auth: "  username: scd\n  password: pw\n",
			authHdr: "Basic c2NkOnB3", unknown: 4 * time.Second, wantReady: "does not know it yet", applied: true, bad: true},
		{name: "wire format, 8-byte global ids, server root, bearer token",
			framing: "wire8", useID: "globalId", auth: fmt.Sprintf("  token_file: %q\n", filepath.Join(dir, "token")),
			authHdr: "Bearer " + token, applied: true},
		{name: "as-confluent: 4-byte content ids, v3 API", framing: "wire4", useID: "contentId", path: "/apis/registry/v3",
			auth: "  username: scd\n  password: pw\n", authHdr: "Basic c2NkOnB3", applied: true},
		{name: "a wrong path: records wait, nothing is a dead letter", framing: "headers", useID: "globalId", path: "/registry",
			auth: "  username: scd\n  password: pw\n", authHdr: "Basic c2NkOnB3", wantReady: "does not answer as Apicurio's API"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := &fakeApicurio{auth: tc.authHdr, unknownFor: tc.unknown,
				global:  map[int64]string{1: src.AvroKeySchema(), 2: src.AvroValueSchema()},
				content: map[int64]string{1: src.AvroValueSchema(), 2: src.AvroKeySchema()}}
			valueID, keyID := 1, 2 // content ids
			if tc.useID == "globalId" {
				valueID, keyID = 2, 1
			}
			srv := httptest.NewServer(reg)
			t.Cleanup(srv.Close)
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
			const n = 8
			var changes []scdtest.Change
			for i := 0; i < n; i++ {
				changes = append(changes, scdtest.Change{Op: "c", After: scdtest.Row{"id": i, "plan": "free"}, LSN: int64(100 + i)})
			}
			for i := 0; i < n/2; i++ {
				changes = append(changes, scdtest.Change{Op: "u", Before: scdtest.Row{"id": i, "plan": "free"}, After: scdtest.Row{"id": i, "plan": "pro"}, LSN: int64(200 + i)})
			}
			changes = append(changes, scdtest.Change{Op: "d", Before: scdtest.Row{"id": 0, "plan": "pro"}, LSN: 300})
			for i, c := range changes {
				c.Commit = time.Date(2026, 3, 1, 0, 0, i, 0, time.UTC)
				k, v := src.AvroEnvelope(c, valueID, keyID)
				rec := &kgo.Record{Topic: src.Topic(), Key: k, Value: v}
				switch tc.framing {
				case "headers":
					kh, vh := debezium.ApicurioKeyGlobalID, debezium.ApicurioValueGlobalID
					if tc.useID == "contentId" {
						kh, vh = debezium.ApicurioKeyContentID, debezium.ApicurioValueContentID
					}
					var kid, vid []byte
					rec.Key, kid = scdtest.ApicurioHeaders(k)
					rec.Value, vid = scdtest.ApicurioHeaders(v)
					rec.Headers = []kgo.RecordHeader{{Key: kh, Value: kid}, {Key: vh, Value: vid}}
				case "wire8":
					rec.Key, rec.Value = scdtest.ApicurioWire8(k), scdtest.ApicurioWire8(v)
				}
				if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
					t.Fatal(err)
				}
				if tc.bad && i == 0 {
					bad := *rec
					// The id cut short, and a header key with a NUL, which jsonb
					// cannot hold as such.
					bad.Headers = []kgo.RecordHeader{rec.Headers[0], {Key: rec.Headers[1].Key, Value: rec.Headers[1].Value[1:]},
						{Key: "odd\x00key", Value: []byte("v")}}
					if err := cl.ProduceSync(context.Background(), &bad).FirstErr(); err != nil {
						t.Fatal(err)
					}
				}
			}
			dsn := pgtest.NewDatabase(t)
			if tc.bad {
				// The dead-letter table as an earlier version made it, without
				// headers: the service adds the column.
				pool, err := pgxpool.New(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				_, err = pool.Exec(context.Background(), `CREATE TABLE scd2sink_dead_letters (
					id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text, partition integer,
					"offset" bigint, target text, key bytea, value bytea, error text NOT NULL,
					created_at timestamptz NOT NULL DEFAULT now())`)
				pool.Close()
				if err != nil {
					t.Fatal(err)
				}
			}
			brokers, _ := json.Marshal(kafka.ListenAddrs())
			addr := freeAddr(t)
			cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, sasl: {allow_plaintext: true}} # the test registry is plain http
postgres: {dsn: %q}
http: {addr: %q}
schema_registry:
  kind: apicurio
  use_id: %s
  url: %q
%s
sequencer: {reorder_window: 10ms}
sink: {batch_max_wait: 10ms}
tables:
  - topic: %s
    target: plans_history
    format: debezium-avro
`, brokers, dsn, addr, tc.useID, srv.URL+tc.path, tc.auth, src.Topic())), func(string) (string, bool) { return "", false })
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg, Options{Logger: zap.NewNop()}) }()
			var notReady string
			var notReadyAt time.Time
			// Records that must wait: until /readyz says why and a second
			// more (a loaded machine may take seconds to join and fetch).
			deadline := time.Now().Add(30 * time.Second)
			applied := false
			for time.Now().Before(deadline) && !applied {
				if code, body := getReadyz(addr); code == http.StatusServiceUnavailable && strings.Contains(body, tc.wantReady) && notReady == "" {
					notReady, notReadyAt = body, time.Now()
				}
				if !tc.applied && notReady != "" && time.Since(notReadyAt) > time.Second {
					break
				}
				applied = metricHas(addr, fmt.Sprintf("scd2sink_events_applied_total %d", len(changes)))
				time.Sleep(50 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if tc.wantReady != "" && notReady == "" {
				t.Errorf("/readyz never said %q", tc.wantReady)
			}
			t.Logf("/readyz while waiting: %s; the registry was asked %d times", strings.TrimSpace(notReady), reg.asked.Load())
			pool, err := pgxpool.New(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			var dead int
			var why, hdrs string
			if err := pool.QueryRow(context.Background(), `SELECT count(*), coalesce(max(error), ''), coalesce(max(headers::text), '')
				FROM scd2sink_dead_letters`).Scan(&dead, &why, &hdrs); err != nil {
				t.Fatal(err)
			}
			switch {
			case !tc.bad && dead != 0:
				t.Fatalf("%d dead letters (%s)", dead, why)
			case tc.bad && (dead != 1 || !strings.Contains(why, "holds 7 bytes") || !strings.Contains(hdrs, `"key": "apicurio.value.globalId", "value": "AAAAAAAAAg=="`) || !strings.Contains(hdrs, `odd\\0key`)):
				t.Fatalf("%d dead letters (%s), headers %s; want the one cut short, with its headers", dead, why, hdrs)
			}
			if !tc.applied {
				return
			}
			var versions, current, pro int
			if err := pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE is_current),
				count(*) FILTER (WHERE plan = 'pro' AND is_current) FROM plans_history`).Scan(&versions, &current, &pro); err != nil {
				t.Fatal(err)
			}
			if versions != n+n/2 || current != n-1 || pro != n/2-1 {
				t.Errorf("%d versions, %d current, %d current pro; want %d, %d, %d", versions, current, pro, n+n/2, n-1, n/2-1)
			}
		})
	}
}
