package app

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"
)

// TestConsistentViews: scd2sink_consistent_through() is the least
// complete_through of every target (or of those named; NULL for one not
// known), and <target>_consistent holds exactly the versions
// <target>_as_of returns at that instant; a join of two such views reads
// the instant once per view, never per row.
func TestConsistentViews(t *testing.T) {
	t.Parallel()
	a, o := patternSource("public", "accounts"), patternSource("public", "orders")
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, a.Topic(), o.Topic()))
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
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 50ms}
sink: {batch_max_wait: 10ms}
tables:
  - {topic: %s, target: accounts_history}
  - {topic: %s, target: orders_history}
`, brokers, dsn, a.Topic(), o.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, Options{Logger: zaptest.NewLogger(t)}) }()
	t.Cleanup(func() { cancel(); <-done })
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	// Changes of both tables an hour ago, a minute apart, each key
	// updated: versions that close inside the span.
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	var recs []*kgo.Record
	for i := 0; i < 40; i++ {
		src, op := a, "c"
		if i%2 == 1 {
			src = o
		}
		if i >= 20 {
			op = "u"
		}
		k, v := src.Envelope(scdtest.Change{Op: op, After: scdtest.Row{"id": i % 10, "plan": fmt.Sprint("p", i)}, LSN: int64(100 + i),
			Commit: base.Add(time.Duration(i) * time.Minute)})
		recs = append(recs, &kgo.Record{Topic: src.Topic(), Key: k, Value: v})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var through *time.Time
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM scd2sink_watermarks WHERE complete_through IS NOT NULL`).Scan(&n)
		if n == 2 {
			_ = pool.QueryRow(context.Background(), `SELECT scd2sink_consistent_through()`).Scan(&through)
			if through != nil && !through.Before(base.Add(39*time.Minute).Add(-50*time.Millisecond)) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never complete through the last change: %v", through)
		}
	}
	// One snapshot for all: the watermark moves on while the test reads.
	tx, err := pool.BeginTx(context.Background(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	one := func(sql string) string {
		t.Helper()
		var s *string
		if err := tx.QueryRow(context.Background(), sql).Scan(&s); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		if s == nil {
			return "NULL"
		}
		return *s
	}
	for _, c := range []struct{ got, want string }{
		{"SELECT scd2sink_consistent_through()::text", "SELECT min(complete_through)::text FROM scd2sink_watermarks"},
		{"SELECT scd2sink_consistent_through(ARRAY['orders_history'])::text", "SELECT complete_through::text FROM scd2sink_watermarks WHERE target = 'orders_history'"},
		{"SELECT scd2sink_consistent_through(ARRAY['orders_history', 'nope'])::text", "SELECT NULL::text"},
		{"SELECT string_agg(scd_id::text, ',' ORDER BY scd_id) FROM accounts_history_consistent",
			"SELECT string_agg(scd_id::text, ',' ORDER BY scd_id) FROM accounts_history_as_of(scd2sink_consistent_through())"},
		{"SELECT string_agg(scd_id::text, ',' ORDER BY scd_id) FROM orders_history_consistent",
			"SELECT string_agg(scd_id::text, ',' ORDER BY scd_id) FROM orders_history_as_of(scd2sink_consistent_through())"},
		{"SELECT count(*)::text FROM accounts_history_consistent", "SELECT '5'"},
	} {
		if g, w := one(c.got), one(c.want); g != w || g == "NULL" && !strings.Contains(c.got, "nope") {
			t.Errorf("%s = %s, want %s (%s)", c.got, g, w, c.want)
		}
	}
	// The instant is read once per statement (once per view), never per
	// row: PostgreSQL counts the function's calls.
	ftx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer ftx.Rollback(context.Background())
	var rowsJoined, calls int64
	if _, err := ftx.Exec(context.Background(), `SET LOCAL track_functions = 'all'`); err != nil {
		t.Fatal(err)
	}
	if err := ftx.QueryRow(context.Background(), `SELECT count(*) FROM accounts_history_consistent a, orders_history_consistent o`).Scan(&rowsJoined); err != nil {
		t.Fatal(err)
	}
	if err := ftx.QueryRow(context.Background(), `SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE funcname = 'scd2sink_consistent_through'`).Scan(&calls); err != nil {
		t.Fatal(err)
	}
	if rowsJoined != 25 || calls == 0 || calls > 2 {
		t.Errorf("a join of %d rows called scd2sink_consistent_through %d times, want once per view", rowsJoined, calls)
	}
}
