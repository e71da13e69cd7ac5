package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestDeadLetterReplay, through the binary: plan is varchar(5) (altered
// by hand), so customer 1's change to "enterprise" and customer 2's to
// "premium-plus-x" are dead-lettered while later changes go on (these
// are rejected after decoding: the replay reads their records again from
// Kafka). The column is widened to varchar(12) by hand while run keeps
// running (its cached statements must be prepared again, not stop it),
// and the dead letters replayed: 1's change is applied as a late event
// (its versions split, a repair row recorded), 2's fails again (14
// characters) and stays, with the new error; exit 1. A second replay
// applies nothing twice. run goes on exactly afterwards; `dead-letters
// list` shows 2's alone; verify finds nothing wrong.
func TestDeadLetterReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "plan", Schema: `{"type":"string","optional":true}`}}}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, src.Topic()))
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	day := func(d int) time.Time { return time.Date(2026, 3, d, 12, 0, 0, 0, time.UTC) }
	rec := func(op string, id int, plan string, lsn int64, d int) *kgo.Record {
		k, v := src.Envelope(scdtest.Change{Op: op, After: scdtest.Row{"id": id, "plan": plan}, LSN: lsn, Commit: day(d)})
		return &kgo.Record{Topic: src.Topic(), Key: k, Value: v}
	}
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfgFile := filepath.Join(t.TempDir(), "scd2sink.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf(`kafka: {brokers: %s, group_id: replay}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 50ms}
sink: {batch_max_wait: 20ms}
tables:
  - {topic: %s, target: customers_history, keys: [id], track_history: [plan]}
`, brokers, dsn, src.Topic())), 0o600); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(recs ...*kgo.Record) {
		t.Helper()
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(binary(t), "run", "--config", cfgFile)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	produce(rec("c", 1, "basic", 100, 1), rec("c", 2, "basic", 110, 1), rec("c", 3, "basic", 120, 1))
	waitApplied(t, pool, 3, time.Minute)
	// The _current view reads the column: altered by hand, it is dropped
	// and created again around the change, as an operator would.
	alterPlan := func(typ string) {
		t.Helper()
		if _, err := pool.Exec(ctx, fmt.Sprintf(`DO $$ DECLARE d text := pg_get_viewdef('customers_history_current'); dc text := pg_get_viewdef('customers_history_consistent');
			c text := obj_description('customers_history_current'::regclass);
			BEGIN
				DROP VIEW customers_history_current, customers_history_consistent;
				ALTER TABLE customers_history ALTER COLUMN plan TYPE %s;
				EXECUTE 'CREATE VIEW customers_history_current AS ' || d;
			EXECUTE 'CREATE VIEW customers_history_consistent AS ' || dc;
				EXECUTE format('COMMENT ON VIEW customers_history_current IS %%L', c);
			END $$`, typ)); err != nil {
			t.Fatal(err)
		}
	}
	alterPlan("varchar(5)")
	// 3's change, replayed, splits the version run remembers as 3's
	// current one: run must not trust what it remembers of 3 afterwards.
	produce(rec("u", 1, "enterprise", 200, 2), rec("u", 2, "premium-plus-x", 210, 2), rec("u", 1, "pro", 300, 3),
		rec("u", 3, "enterprise", 220, 2))
	waitApplied(t, pool, 7, time.Minute)
	waitFor(t, pool, `SELECT count(*) = 3 FROM scd2sink_dead_letters`, 30*time.Second)
	// 3 back to basic (no new version while enterprise is missing): a
	// batch of its own, so that run now remembers 3's current version.
	produce(rec("u", 3, "basic", 230, 3))
	waitApplied(t, pool, 8, time.Minute)
	history := func() string {
		t.Helper()
		var s string
		if err := pool.QueryRow(ctx, `SELECT string_agg(id || ' ' || plan || ' ' || to_char(valid_from, 'DD') || '-' || coalesce(to_char(valid_to, 'DD'), ''), ', ' ORDER BY id, valid_from) FROM customers_history`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got, want := history(), "1 basic 01-03, 1 pro 03-, 2 basic 01-, 3 basic 01-"; got != want {
		t.Fatalf("before the replay: %q, want %q", got, want)
	}
	out, err := exec.Command(binary(t), "dead-letters", "list", "--config", cfgFile).CombinedOutput()
	if err != nil || strings.Count(string(out), "\n") != 4 || !strings.Contains(string(out), "22001") {
		t.Fatalf("dead-letters list (%v):\n%s", err, out)
	}
	t.Logf("dead-letters list:\n%s", out)

	alterPlan("varchar(12)")
	replay := func() (int, string) {
		c := exec.Command(binary(t), "dead-letters", "replay", "--config", cfgFile, "--all")
		out, _ := c.CombinedOutput()
		return c.ProcessState.ExitCode(), string(out)
	}
	code, got := replay()
	t.Logf("replay (exit %d):\n%s", code, got)
	if code != 1 || !strings.Contains(got, "applied") || !strings.Contains(got, "failed again") || !strings.Contains(got, "2 replayed, 1 failed again") {
		t.Fatalf("replay: exit %d\n%s", code, got)
	}
	if got, want := history(), "1 basic 01-02, 1 enterprise 02-03, 1 pro 03-, 2 basic 01-, 3 basic 01-02, 3 enterprise 02-03, 3 basic 03-"; got != want {
		t.Fatalf("after the replay: %q, want %q", got, want)
	}
	var repairs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM customers_history_scd_repairs WHERE key->>'id' = '1'`).Scan(&repairs); err != nil || repairs == 0 {
		t.Errorf("%d repair rows for customer 1 (%v)", repairs, err)
	}
	var left int
	var msg string
	if err := pool.QueryRow(ctx, `SELECT count(*), max(error) FROM scd2sink_dead_letters WHERE replayed_at IS NULL`).Scan(&left, &msg); err != nil || left != 1 || !strings.Contains(msg, "character varying(12)") {
		t.Errorf("%d dead letters left (%v), error %q", left, err, msg)
	}
	// Again: nothing applied twice (the replayed rows keep their
	// replayed_at), 2's still failing.
	replayedAt := func() string {
		t.Helper()
		var s string
		if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(id || ' ' || replayed_at, ', ' ORDER BY id), '') FROM scd2sink_dead_letters WHERE replayed_at IS NOT NULL`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := replayedAt()
	code, got = replay()
	if again := replayedAt(); again != first || strings.Count(first, ",") != 1 {
		t.Errorf("replayed rows %q after the first replay, %q after the second", first, again)
	}
	if code != 1 || !strings.Contains(got, "0 replayed, 1 failed again") {
		t.Errorf("second replay: exit %d\n%s", code, got)
	}
	if got, want := history(), "1 basic 01-02, 1 enterprise 02-03, 1 pro 03-, 2 basic 01-, 3 basic 01-02, 3 enterprise 02-03, 3 basic 03-"; got != want {
		t.Fatalf("after the second replay: %q, want %q", got, want)
	}
	// run, which kept running, goes on exactly over the repaired keys.
	produce(rec("u", 1, "team", 400, 4), rec("u", 2, "pro", 410, 4), rec("u", 3, "pro", 420, 4))
	waitApplied(t, pool, 11, time.Minute)
	if got, want := history(), "1 basic 01-02, 1 enterprise 02-03, 1 pro 03-04, 1 team 04-, 2 basic 01-04, 2 pro 04-, 3 basic 01-02, 3 enterprise 02-03, 3 basic 03-04, 3 pro 04-"; got != want {
		t.Fatalf("run after the replay: %q, want %q", got, want)
	}
	out, err = exec.Command(binary(t), "dead-letters", "list", "--config", cfgFile, "--table", "customers_history").CombinedOutput()
	if err != nil || strings.Count(string(out), "\n") != 2 || !strings.Contains(string(out), "character varying(12)") {
		t.Errorf("dead-letters list after the replay (%v):\n%s", err, out)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("scd2sink: %v", err)
	}
	if out, err := exec.Command(binary(t), "verify", "--config", cfgFile).CombinedOutput(); err != nil {
		t.Fatalf("verify: %v\n%s", err, out)
	}
}
