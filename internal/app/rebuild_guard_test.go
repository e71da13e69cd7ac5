package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRebuildKeepsGuardDecisions: a snapshot reading 1 of 5 customers is
// held by the guard. A rebuild while it is held swaps in a table where it
// is still held (and listed for the live group: reconcile can confirm
// it); once confirmed (4 keys closed), a second rebuild applies it as run
// did, and nothing is held afterwards.
func TestRebuildKeepsGuardDecisions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := patternSource("public", "customers")
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, src.Topic()), kfake.GroupMinSessionTimeout(time.Second))
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
	var recs []*kgo.Record
	for id := 1; id <= 5; id++ {
		k, v := src.Envelope(scdtest.Change{Op: "c", After: scdtest.Row{"id": id, "plan": "basic"}, LSN: int64(100 + id), Commit: day(1)})
		recs = append(recs, &kgo.Record{Topic: src.Topic(), Key: k, Value: v})
	}
	k, v := src.Envelope(scdtest.Change{Op: "r", After: scdtest.Row{"id": 1, "plan": "basic"}, LSN: 500, Commit: day(4), Snapshot: "last"})
	recs = append(recs, &kgo.Record{Topic: src.Topic(), Key: k, Value: v})
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	dsn := pgtest.NewDatabase(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, group_id: live, session_timeout: 2s}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 20ms}
sink: {batch_max_wait: 10ms}
tables:
  - {topic: %s, target: customers_history, keys: [id], snapshot_deletes: close}
`, brokers, dsn, src.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	query := func(q string) int {
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg, Options{}) }()
	for deadline := time.Now().Add(30 * time.Second); query(`SELECT count(*) FROM scd2sink_snapshots WHERE held_at IS NOT NULL`) != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the reconciliation was not held")
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	closed := `SELECT count(*) FROM customers_history WHERE valid_to IS NOT NULL`
	heldLive := `SELECT count(*) FROM scd2sink_snapshots WHERE consumer_group = 'live' AND target = 'customers_history' AND held_at IS NOT NULL AND done_at IS NULL`
	if err := Rebuild(ctx, cfg, Options{}, RebuildMode{}); err != nil {
		t.Fatal(err)
	}
	if n, h := query(closed), query(heldLive); n != 0 || h != 1 {
		t.Fatalf("after a rebuild while held: %d versions closed (want 0), %d held for the live group (want 1)", n, h)
	}
	if err := Reconcile(ctx, cfg, Options{}, "customers_history", true, io.Discard); err != nil {
		t.Fatalf("reconcile --confirm after the rebuild: %v", err)
	}
	if n := query(closed); n != 4 {
		t.Fatalf("confirmed: %d versions closed, want 4", n)
	}
	if err := Rebuild(ctx, cfg, Options{}, RebuildMode{}); err != nil {
		t.Fatal(err)
	}
	if n, h := query(closed), query(heldLive); n != 4 || h != 0 {
		t.Fatalf("after a rebuild of the confirmed history: %d versions closed (want 4), %d held (want 0)", n, h)
	}
}

// TestReplayRefusedDuringRebuild: while the rebuild group has a member,
// a replay and a confirmation are refused (the swap would drop what they
// wrote into the live tables).
func TestReplayRefusedDuringRebuild(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "src.x"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	member, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.ConsumerGroup("live"+RebuildSuffix), kgo.ConsumeTopics("src.x"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(member.Close)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	member.PollFetches(pctx) // joins the group
	cancel()
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, group_id: live}
postgres: {dsn: "postgres://nobody@127.0.0.1:1/none"}
tables:
  - {topic: src.x, target: x_history, snapshot_deletes: close}
`, brokers)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"replay":    ReplayDeadLetters(ctx, cfg, Options{}, DeadLetterQuery{All: true}, io.Discard),
		"reconcile": Reconcile(ctx, cfg, Options{}, "x_history", true, io.Discard),
	} {
		if err == nil || !strings.Contains(err.Error(), "a rebuild is running") {
			t.Errorf("%s during a rebuild: %v", name, err)
		}
	}
}
