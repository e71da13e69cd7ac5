package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/internal/status"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"
)

// A marker in the bad record's key and value: it must never reach the
// status page, its JSON or the status command.
const statusMarker = "PRIVATE-VALUE-7731"

// statusRig runs the service over two tables: orders_history parked by
// a lock another session holds, customers_history with a dead letter.
type statusRig struct {
	t         *testing.T
	pool      *pgxpool.Pool
	cfg       *config.Config
	addr, dsn string
}

func newStatusRig(t *testing.T) *statusRig {
	t.Helper()
	orders, customers := patternSource("public", "orders"), patternSource("public", "customers")
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, orders.Topic(), customers.Topic()), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	r := &statusRig{t: t, dsn: pgtest.NewDatabase(t), addr: freeAddr(t)}
	if r.pool, err = pgxpool.New(context.Background(), r.dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.pool.Close)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	r.cfg, err = config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, session_timeout: 2s, group_id: status-test}
postgres: {dsn: %q, lock_timeout: 200ms}
http: {addr: %q}
shutdown_timeout: 3s
sequencer: {reorder_window: 10ms}
sink: {batch_max_wait: 10ms}
tables:
  - {topic: %s, target: orders_history}
  - {topic: %s, target: customers_history}
`, brokers, r.dsn, r.addr, orders.Topic(), customers.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, r.cfg, Options{Logger: zaptest.NewLogger(t), ConfigPath: "/etc/scd2sink/scd2sink.yaml", Version: "test", statusEvery: 250 * time.Millisecond})
	}()
	t.Cleanup(func() { cancel(); <-done })

	producePlans(t, cl, orders, 3)
	producePlans(t, cl, customers, 4)
	r.waitCount("orders_history", 3)
	r.waitCount("customers_history", 4)

	// Park orders_history: another session holds a lock its writes need
	// (readers may go on), longer than lock_timeout, for the rest of the
	// test.
	lockTx, err := r.pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lockTx.Rollback(context.Background()) })
	if _, err := lockTx.Exec(context.Background(), `LOCK TABLE orders_history IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	k, v := orders.Envelope(scdtest.Change{Op: "u", After: scdtest.Row{"id": 1, "plan": "team"}, LSN: 500, Commit: time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)})
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: orders.Topic(), Key: k, Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// A record of customers that does not decode: a dead letter.
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: customers.Topic(),
		Key: []byte(`{"id":"` + statusMarker + `"}`), Value: []byte(`not json ` + statusMarker)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *statusRig) waitCount(table string, want int) {
	r.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var n int
		if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: want %d versions", table, want)
		}
	}
}

func (r *statusRig) get(path string) (int, string) {
	resp, err := http.Get("http://" + r.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitReport polls /status.json until ok holds for it.
func (r *statusRig) waitReport(ok func(status.Report) bool) status.Report {
	r.t.Helper()
	var rep status.Report
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		code, body := r.get("/status.json")
		rep = status.Report{}
		if code == http.StatusOK && json.Unmarshal([]byte(body), &rep) == nil && ok(rep) {
			return rep
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("status.json never showed what was expected; last:\n%s", body)
		}
	}
}

func target(rep status.Report, name string) status.Target {
	for _, t := range rep.Targets {
		if t.Target == name {
			return t
		}
	}
	return status.Target{}
}

// check compares a report with PostgreSQL: versions, dead letters by
// reason; and looks for what must never be on it.
func (r *statusRig) check(rep status.Report, text string) {
	r.t.Helper()
	for _, name := range []string{"orders_history", "customers_history"} {
		var n int64
		if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+name).Scan(&n); err != nil {
			r.t.Fatal(err)
		}
		if got := target(rep, name).Versions; got == nil || *got != n {
			r.t.Errorf("%s: versions %v, PostgreSQL has %d (errors %v)", name, got, n, rep.Errors)
		}
	}
	var dead int64
	if err := r.pool.QueryRow(context.Background(), `SELECT count(*) FROM scd2sink_dead_letters
		WHERE target = 'customers_history' AND reason = 'decode' AND replayed_at IS NULL`).Scan(&dead); err != nil {
		r.t.Fatal(err)
	}
	if got := target(rep, "customers_history").DeadLetters["decode"]; got != dead || dead != 1 {
		r.t.Errorf("customers_history: %d decode dead letters on the report, %d in PostgreSQL (want 1)", got, dead)
	}
	if len(target(rep, "orders_history").DeadLetters) != 0 {
		r.t.Errorf("orders_history: dead letters %v, want none", target(rep, "orders_history").DeadLetters)
	}
	for _, secret := range []string{statusMarker, r.dsn} {
		if strings.Contains(text, secret) {
			r.t.Errorf("the report shows %q:\n%s", secret, text)
		}
	}
}

// TestStatus: while one table is parked by a held lock and another has a
// dead letter, /status.json, the page and `scd2sink status` (from the
// running instance, and from Kafka and PostgreSQL alone) agree with
// PostgreSQL, name the parked table's reason and the command that
// replays the dead letter, and show no value, key or secret. The page is
// read in a real headless Chromium (status_browser_test.go).
func TestStatus(t *testing.T) {
	t.Parallel()
	r := newStatusRig(t)
	rep := r.waitReport(func(rep status.Report) bool {
		return target(rep, "orders_history").State == status.StateParked && target(rep, "customers_history").DeadLetters["decode"] == 1
	})
	_, body := r.get("/status.json")
	r.check(rep, body)
	orders, customers := target(rep, "orders_history"), target(rep, "customers_history")
	if !strings.Contains(orders.Reason, "lock timeout") || !strings.Contains(orders.Reason, "55P03") || orders.ParkedSince == nil {
		t.Errorf("orders_history's reason %q (since %v): want the lock timeout", orders.Reason, orders.ParkedSince)
	}
	if want := "scd2sink dead-letters replay --config /etc/scd2sink/scd2sink.yaml --table customers_history"; customers.ReplayCommand != want {
		t.Errorf("replay command %q, want %q", customers.ReplayCommand, want)
	}
	if customers.CompleteThrough == nil || customers.LagEvents == nil || *customers.LagEvents != 0 {
		t.Errorf("customers_history: complete_through %v, lag %v: want a watermark and no lag", customers.CompleteThrough, customers.LagEvents)
	}
	if len(rep.Group.Members) != 1 || len(rep.Group.Members[0].Partitions) != 2 {
		t.Errorf("group members %+v: want one member holding both topics", rep.Group.Members)
	}

	code, page := r.get("/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d", code)
	}
	for _, want := range []string{`class="badge parked"`, "lock timeout", customers.ReplayCommand, "1</span> decode", `http-equiv="refresh"`, "<svg"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	r.check(rep, page)
	if code, _ := r.get("/nothing"); code != http.StatusNotFound {
		t.Errorf("GET /nothing: %d, want 404", code)
	}

	t.Run("command from the instance", func(t *testing.T) {
		var out bytes.Buffer
		trouble, err := Status(context.Background(), r.cfg, Options{ConfigPath: "/etc/scd2sink/scd2sink.yaml"}, false, &out)
		if err != nil || !trouble {
			t.Fatalf("Status: trouble %v, %v", trouble, err)
		}
		for _, want := range []string{"from the running instance at http://" + r.addr, "orders_history is parked: lock timeout", customers.ReplayCommand} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("status lacks %q:\n%s", want, out.String())
			}
		}
		r.check(rep, out.String())
	})
	t.Run("command without an instance", func(t *testing.T) {
		cfg := *r.cfg
		dead := freeAddr(t)
		cfg.HTTP.Addr = &dead
		var out bytes.Buffer
		trouble, err := Status(context.Background(), &cfg, Options{ConfigPath: "/etc/scd2sink/scd2sink.yaml"}, true, &out)
		if err != nil || !trouble {
			t.Fatalf("Status: trouble %v, %v", trouble, err)
		}
		var off status.Report
		if err := json.Unmarshal(out.Bytes(), &off); err != nil {
			t.Fatal(err)
		}
		if off.Source != "kafka and postgresql" || !strings.Contains(off.Note, "no running instance answered") {
			t.Errorf("source %q, note %q", off.Source, off.Note)
		}
		r.check(off, out.String())
		if s := target(off, "orders_history").State; s == status.StateParked {
			t.Errorf("without an instance orders_history cannot be known parked, got %q", s)
		}
	})
	t.Run("PostgreSQL away", func(t *testing.T) {
		// Nothing is known to be fine when PostgreSQL cannot be read: each
		// table is unknown, the command exits 1, the password never shows.
		cfg := *r.cfg
		dead := freeAddr(t)
		cfg.HTTP.Addr = &dead
		cfg.Postgres.DSN = "postgres://scd:hunter2@" + freeAddr(t) + "/db?sslmode=disable&connect_timeout=2"
		var out bytes.Buffer
		trouble, err := Status(context.Background(), &cfg, Options{}, false, &out)
		if err != nil || !trouble {
			t.Fatalf("Status: trouble %v, %v\n%s", trouble, err, out.String())
		}
		for _, want := range []string{"orders_history     unknown", "cannot read PostgreSQL"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("status lacks %q:\n%s", want, out.String())
			}
		}
		if strings.Contains(out.String(), "hunter2") || strings.Contains(out.String(), "no table needs attention") {
			t.Errorf("status:\n%s", out.String())
		}
	})
	t.Run("browser", func(t *testing.T) { browseStatus(t, "http://"+r.addr+"/") })
}
