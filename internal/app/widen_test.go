package app

import (
	"context"
	"encoding/json"
	"fmt"
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

// TestWidenedColumn: the source widens score from int32 to int64 (and
// visits from int16 to int32) mid-stream, as Debezium's schema then says.
// The history and side tables' columns are altered to bigint and integer,
// the views go on reading them, the value that needs the wider type is
// stored (no dead letter), and the change alone opens no version. A
// column altered by hand under the running instance does not turn its
// stale statements into dead letters.
func TestWidenedColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "accounts", Keys: []string{"id"}, Cols: []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "plan", Schema: `{"type":"string","optional":true}`},
		{Name: "score", Schema: `{"type":"int32","optional":true}`},
		{Name: "visits", Schema: `{"type":"int16","optional":true}`},
	}}
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
	day := func(d int) time.Time { return time.Date(2026, 3, d, 12, 0, 0, 0, time.UTC) }
	produce := func(op string, id int, plan string, score int64, visits int, lsn int64, d int) {
		t.Helper()
		k, v := src.Envelope(scdtest.Change{Op: op, After: scdtest.Row{"id": id, "plan": plan, "score": score, "visits": visits}, LSN: lsn, Commit: day(d)})
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: src.Topic(), Key: k, Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	dsn := pgtest.NewDatabase(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 10ms}
sink: {batch_max_wait: 10ms}
tables:
  - {topic: %s, target: accounts_history, track_history: [plan, score],
     views: [{name: dim_account, columns: {scd_id: account_key}}]}
`, brokers, dsn, src.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg, Options{Logger: zaptest.NewLogger(t)}) }()
	t.Cleanup(func() { cancel(); <-done })
	waitQuery := func(q, want string) {
		t.Helper()
		var got string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if err := pool.QueryRow(ctx, q).Scan(&got); err == nil && got == want {
				return
			}
		}
		t.Fatalf("%s: %q, want %q", q, got, want)
	}
	produce("c", 1, "basic", 5, 1, 100, 1)
	waitQuery(`SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'accounts_history'::regclass AND attname = 'score'`, "integer")

	// The source widens the columns.
	src.Cols[2].Schema = `{"type":"int64","optional":true}`
	src.Cols[3].Schema = `{"type":"int32","optional":true}`
	produce("u", 1, "basic", 5, 70000, 200, 2) // same tracked values: no version
	produce("c", 2, "pro", 5_000_000_000, 1, 210, 2)
	history := `SELECT string_agg(id || ' ' || plan || ' ' || score || ' ' || visits || ' ' || to_char(valid_from, 'DD') || '-' || coalesce(to_char(valid_to, 'DD'), ''), ', ' ORDER BY id, valid_from) FROM accounts_history`
	waitQuery(history, "1 basic 5 70000 01-, 2 pro 5000000000 1 02-")
	for _, c := range []struct{ table, col, want string }{
		{"accounts_history", "score", "bigint"}, {"accounts_history", "visits", "integer"},
		{"accounts_history_scd_events", "score", "bigint"}, {"accounts_history_scd_events", "visits", "integer"},
	} {
		waitQuery(fmt.Sprintf(`SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = '%s'::regclass AND attname = '%s'`, c.table, c.col), c.want)
	}
	waitQuery(`SELECT string_agg(id || ':' || score, ',' ORDER BY id) FROM accounts_history_current`, "1:5,2:5000000000")
	waitQuery(`SELECT (count(account_key) = 2 AND max(score) = 5000000000)::text FROM dim_account`, "true")
	waitQuery(`SELECT count(*)::text FROM accounts_history_as_of('infinity')`, "2")
	waitQuery(`SELECT count(*)::text FROM scd2sink_dead_letters`, "0")
	// And on: a tracked change in the wide type.
	produce("u", 2, "pro", 6_000_000_000, 1, 300, 3)
	waitQuery(history, "1 basic 5 70000 01-, 2 pro 5000000000 1 02-03, 2 pro 6000000000 1 03-")

	// visits altered to bigint by hand (or by another instance) while run
	// runs: its connections' COPY column types are stale (int4 binary for
	// an int8 column: 22P03). That is retried on fresh connections, never
	// taken for a value PostgreSQL rejects.
	if _, err := pool.Exec(ctx, `DO $$ DECLARE d text := pg_get_viewdef('accounts_history_current'); v text := pg_get_viewdef('dim_account');
			dc text := pg_get_viewdef('accounts_history_consistent');
		BEGIN
			DROP VIEW accounts_history_current, dim_account, accounts_history_consistent;
			ALTER TABLE accounts_history ALTER COLUMN visits TYPE bigint;
			ALTER TABLE accounts_history_scd_events ALTER COLUMN visits TYPE bigint;
			EXECUTE 'CREATE VIEW accounts_history_current AS ' || d;
			EXECUTE 'CREATE VIEW dim_account AS ' || v;
			EXECUTE 'CREATE VIEW accounts_history_consistent AS ' || dc;
		END $$`); err != nil {
		t.Fatal(err)
	}
	produce("u", 1, "team", 5, 3, 400, 4)
	produce("c", 3, "basic", 7, 4, 410, 4)
	waitQuery(history, "1 basic 5 3 01-04, 1 team 5 3 04-, 2 pro 5000000000 1 02-03, 2 pro 6000000000 1 03-, 3 basic 7 4 04-") // visits is Type 1 (all_versions)
	waitQuery(`SELECT count(*)::text FROM scd2sink_dead_letters`, "0")
}

// TestWideningWaitsForAView: an analyst's view reads the column the
// source widens, so PostgreSQL refuses to alter it. The change waits (no
// dead letter, nothing of it applied, the service keeps running) until
// the view is dropped, then the column is widened and the change applied.
func TestWideningWaitsForAView(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "ranks", Keys: []string{"id"}, Cols: []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "rank", Schema: `{"type":"int16","optional":true}`},
	}}
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
	produce := func(op string, id, rank int, lsn int64) {
		t.Helper()
		k, v := src.Envelope(scdtest.Change{Op: op, After: scdtest.Row{"id": id, "rank": rank}, LSN: lsn, Commit: time.Date(2026, 3, 1, 0, 0, int(lsn), 0, time.UTC)})
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: src.Topic(), Key: k, Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	dsn := pgtest.NewDatabase(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 10ms}
sink: {batch_max_wait: 10ms}
tables:
  - {topic: %s, target: ranks_history}
`, brokers, dsn, src.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg, Options{Logger: zaptest.NewLogger(t)}) }()
	t.Cleanup(func() { cancel(); <-done })
	query := func(q string) string {
		var s string
		if err := pool.QueryRow(ctx, q).Scan(&s); err != nil {
			return "error: " + err.Error()
		}
		return s
	}
	waitQuery := func(q, want string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); query(q) != want; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %q, want %q", q, query(q), want)
			}
		}
	}
	rows := `SELECT coalesce(string_agg(id || ':' || rank, ',' ORDER BY id), '') FROM ranks_history`
	produce("c", 1, 7, 1)
	waitQuery(rows, "1:7")
	if _, err := pool.Exec(ctx, `CREATE VIEW analyst_ranks AS SELECT id, rank FROM ranks_history`); err != nil {
		t.Fatal(err)
	}
	src.Cols[1].Schema = `{"type":"int32","optional":true}`
	produce("c", 2, 40000, 2)
	time.Sleep(2 * time.Second)
	if got := query(rows); got != "1:7" {
		t.Fatalf("while the view blocks the widening: %q, want 1:7 alone", got)
	}
	select {
	case err := <-done:
		done <- err // for the cleanup, which waits for it
		t.Fatalf("Run ended while the widening waited: %v", err)
	default:
	}
	if _, err := pool.Exec(ctx, `DROP VIEW analyst_ranks`); err != nil {
		t.Fatal(err)
	}
	waitQuery(rows, "1:7,2:40000")
	waitQuery(`SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'ranks_history'::regclass AND attname = 'rank'`, "integer")
	waitQuery(`SELECT count(*)::text FROM scd2sink_dead_letters`, "0")
}
