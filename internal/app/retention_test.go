package app

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"
)

// TestRetentionWhileRunning: run with retention: 30d removes, while it
// streams, the versions closed more than 30 days ago (and the whole
// history of a key deleted then) but keeps every current one; a late
// event older than what is left is a dead letter (reason expired), counted, a new one is
// applied, the metrics say what went, and verify passes.
func TestRetentionWhileRunning(t *testing.T) {
	t.Parallel()

	src := patternSource("public", "accounts")
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
	dsn := pgtest.NewDatabase(t)
	addr := freeAddr(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: %q}
sequencer: {reorder_window: 50ms}
sink: {batch_max_wait: 10ms}
tables:
  - {topic: %s, target: accounts_history, retention: 30d}
`, brokers, dsn, addr, src.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, Options{Logger: zaptest.NewLogger(t), retentionFirst: 50 * time.Millisecond, retentionEvery: 200 * time.Millisecond})
	}()
	t.Cleanup(func() { cancel(); <-done })
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	day := 24 * time.Hour
	base := time.Now().Add(-100 * day).Truncate(time.Second)
	produce := func(changes ...scdtest.Change) {
		t.Helper()
		for _, c := range changes {
			k, v := src.Envelope(c)
			if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: src.Topic(), Key: k, Value: v}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	row := func(id int, plan string) scdtest.Row { return scdtest.Row{"id": id, "plan": plan} }
	produce(
		scdtest.Change{Op: "c", After: row(1, "free"), LSN: 100, Commit: base},
		scdtest.Change{Op: "u", Before: row(1, "free"), After: row(1, "pro"), LSN: 200, Commit: base.Add(day)},
		scdtest.Change{Op: "c", After: row(2, "free"), LSN: 300, Commit: base.Add(10 * day)},
		scdtest.Change{Op: "d", Before: row(2, "free"), LSN: 400, Commit: base.Add(20 * day)},
		scdtest.Change{Op: "u", Before: row(1, "pro"), After: row(1, "team"), LSN: 500, Commit: base.Add(50 * day)},
		scdtest.Change{Op: "u", Before: row(1, "team"), After: row(1, "max"), LSN: 600, Commit: base.Add(90 * day)},
		scdtest.Change{Op: "c", After: row(3, "free"), LSN: 700, Commit: time.Now().Add(-time.Hour)},
	)
	query := func(q string) string {
		t.Helper()
		var out string
		if err := pool.QueryRow(context.Background(), q).Scan(&out); err != nil {
			return "error: " + err.Error()
		}
		return out
	}
	versions := `SELECT coalesce(string_agg(id || ':' || plan || ':' || (valid_to IS NULL), ' ' ORDER BY id, valid_from), '') FROM accounts_history`
	// Left: key 1's version opened 60 days ago (closed 10 days ago, after
	// the horizon) and its current one; key 3. Key 2's only version closed
	// 80 days ago.
	want := "1:team:false 1:max:true 3:free:true"
	deadline := time.Now().Add(30 * time.Second)
	for query(versions) != want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := query(versions); got != want {
		t.Fatalf("versions after retention: %s, want %s", got, want)
	}
	if page := waitMetric(addr, `scd2sink_retention_removed_total{table="history",target="accounts_history"} 3`, 10*time.Second); page != "" {
		t.Fatalf("no retention_removed_total of 3 versions:\n%s", grepLines(page, "retention"))
	}

	// Late: an update of key 1 between what was removed (a version it
	// would change is gone): dropped. New: an update of key 3: applied.
	produce(
		scdtest.Change{Op: "u", Before: row(1, "pro"), After: row(1, "gone"), LSN: 250, Commit: base.Add(2 * day)},
		scdtest.Change{Op: "u", Before: row(3, "free"), After: row(3, "pro"), LSN: 800, Commit: time.Now()},
	)
	want = "1:team:false 1:max:true 3:free:false 3:pro:true"
	deadline = time.Now().Add(30 * time.Second)
	for query(versions) != want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := query(versions); got != want {
		t.Fatalf("versions after the late and the new event: %s, want %s", got, want)
	}
	if page := waitMetric(addr, `scd2sink_events_expired_total{target="accounts_history"} 1`, 10*time.Second); page != "" {
		t.Fatalf("the late event was not counted:\n%s", grepLines(page, "expired"))
	}
	// Counted, never dead-lettered (DESIGN.md section 12).
	if got := query(`SELECT count(*)::text FROM scd2sink_dead_letters`); got != "0" {
		t.Errorf("%s dead letters; want none", got)
	}
	horizon := time.Unix(int64(metricValue(t, addr, `scd2sink_retention_horizon_timestamp_seconds{target="accounts_history"}`)), 0)
	if d := time.Since(horizon) - 30*day; d < 0 || d > time.Minute {
		t.Errorf("retention horizon %s, want 30 days ago", horizon)
	}
	var out strings.Builder
	if n, err := Verify(context.Background(), cfg, &out); err != nil || n != 0 {
		t.Fatalf("verify after retention: %d violations, %v:\n%s", n, err, out.String())
	}
}

// grepLines returns the lines of page that contain s.
func grepLines(page, s string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
