package app

import (
	"context"
	"encoding/json"
	"fmt"
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

// TestWatermark: scd2sink_watermarks while changes stream into two tables
// (one topic of 3 partitions, one of 1, one key per change so that
// partitions move on their own). Every time it is read, each target's
// complete_through is never ahead of what is applied: every change whose
// valid time is at or before it is in the history. Once the stream stops,
// both targets, the one whose topic is empty too, are complete through
// the connector's last change less the window.
func TestWatermark(t *testing.T) {
	t.Parallel()
	a, b := patternSource("public", "accounts"), patternSource("public", "empty")
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, a.Topic()), kfake.SeedTopics(1, b.Topic()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	dsn := pgtest.NewDatabase(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	const window = 100 * time.Millisecond
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: %q}
sequencer: {reorder_window: 100ms}
sink: {batch_max_wait: 20ms, batch_max_events: 7}
tables:
  - {topic: %s, target: accounts_history}
  - {topic: %s, target: empty_history}
`, brokers, dsn, freeAddr(t), a.Topic(), b.Topic())), func(string) (string, bool) { return "", false })
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

	// Valid times from an hour ago, one second apart: distinct and far
	// behind the clock, so that only the applied changes can carry the
	// watermark (until the stream stops).
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	stop := make(chan struct{})
	produced := make(chan int, 1)
	go func() {
		n := 0
		defer func() { produced <- n }()
		for ; n < 300; n++ {
			select {
			case <-stop:
				return
			default:
			}
			k, v := a.Envelope(scdtest.Change{Op: "c", After: scdtest.Row{"id": n, "plan": "pro"}, LSN: int64(1000 + n), Commit: base.Add(time.Duration(n) * time.Second)})
			if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: a.Topic(), Key: k, Value: v}).FirstErr(); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(8 * time.Millisecond)
		}
	}()
	checks, ahead := 0, 0
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var w *time.Time
		var applied, behind int
		// One snapshot: the watermark and the history as of the same moment.
		tx, err := pool.BeginTx(context.Background(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			t.Fatal(err)
		}
		_ = tx.QueryRow(context.Background(), `SELECT complete_through FROM scd2sink_watermarks WHERE target = 'accounts_history'`).Scan(&w)
		if w != nil {
			_ = tx.QueryRow(context.Background(), `SELECT count(*) FROM accounts_history`).Scan(&applied)
			// Changes with a valid time at or before w: ids 0..floor((w-base)/1s).
			behind = int(w.Sub(base)/time.Second) + 1
			if behind > 300 {
				behind = 300 // past the stream: the clock's share
			}
			checks++
			if behind > applied {
				ahead++
				t.Errorf("watermark %s claims %d changes complete, %d applied", w.Format(time.RFC3339Nano), behind, applied)
			}
		}
		_ = tx.Rollback(context.Background())
		if applied == 300 {
			break
		}
		time.Sleep(15 * time.Millisecond)
	}
	close(stop)
	if n := <-produced; n != 300 {
		t.Fatalf("produced %d", n)
	}
	t.Logf("%d reads of the watermark while the stream ran, %d ahead of the history", checks, ahead)
	if checks < 10 {
		t.Errorf("only %d reads saw a watermark", checks)
	}
	// Caught up and idle: both targets are complete through the newest
	// valid time their connector wrote (the last change), less the window
	// (the partitions whose last change is older count so), the empty
	// topic too, its connector being the same.
	want := base.Add(299 * time.Second).Add(-window)
	for _, target := range []string{"accounts_history", "empty_history"} {
		var got *time.Time
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			_ = pool.QueryRow(context.Background(), `SELECT complete_through FROM scd2sink_watermarks WHERE target = $1`, target).Scan(&got)
			if got != nil && got.Equal(want) {
				break
			}
		}
		if got == nil || !got.Equal(want) {
			t.Errorf("%s: complete through %v once idle, want %v", target, got, want)
		} else {
			t.Logf("%s: idle, complete through %v", target, got.Format(time.RFC3339Nano))
		}
	}
}

// TestWatermarkConnectors: two connectors whose topic prefixes share their
// first part (prod.shop and prod.billing). billing wrote one change three
// hours ago and stalled; shop goes on writing. billing's target is never
// complete past its own last change: not on shop's progress (the
// connector is source.name, not the topic's first part), and not on the
// clock after a restart that has read nothing of billing since.
func TestWatermarkConnectors(t *testing.T) {
	t.Parallel()
	shop, billing := patternSource("public", "orders"), patternSource("public", "invoices")
	shop.Server, billing.Server = "prod.shop", "prod.billing"
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, shop.Topic(), billing.Topic()))
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
kafka: {brokers: %s, metadata_max_age: 500ms}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 100ms}
sink: {batch_max_wait: 20ms}
tables:
  - topic_pattern: 'prod\.[a-z]+\.public\.[a-z]+'
`, brokers, dsn)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	run := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Run(ctx, cfg, Options{Logger: zaptest.NewLogger(t)}) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	stalled := time.Now().Add(-3 * time.Hour).Truncate(time.Second)
	write := func(src *scdtest.Source, id int, at time.Time) {
		t.Helper()
		k, v := src.Envelope(scdtest.Change{Op: "c", After: scdtest.Row{"id": id, "plan": "pro"}, LSN: int64(1000 + id), Commit: at})
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: src.Topic(), Key: k, Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	write(billing, 0, stalled)
	shopAt := time.Now().Add(-time.Hour).Truncate(time.Second)
	complete := func(target string) *time.Time {
		var got *time.Time
		_ = pool.QueryRow(context.Background(), `SELECT complete_through FROM scd2sink_watermarks WHERE target = $1`, target).Scan(&got)
		return got
	}
	// watch reads both watermarks for d: billing's never passes its last
	// change; shop's reaches its last change less the window.
	watch := func(d time.Duration, shopLast time.Time) {
		t.Helper()
		var shopGot *time.Time
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if got := complete("invoices_history"); got != nil && got.After(stalled) {
				t.Fatalf("invoices_history complete through %v, past billing's last change at %v", got, stalled)
			}
			shopGot = complete("orders_history")
		}
		if want := shopLast.Add(-100 * time.Millisecond); shopGot == nil || !shopGot.Equal(want) {
			t.Errorf("orders_history complete through %v, want %v", shopGot, want)
		}
	}
	stop := run()
	for i := 0; i < 20; i++ {
		write(shop, i, shopAt.Add(time.Duration(i)*time.Second))
	}
	watch(4*time.Second, shopAt.Add(19*time.Second))
	if got := complete("invoices_history"); got == nil {
		t.Error("invoices_history has no watermark at all")
	}
	stop()

	// Restarted: nothing of billing is read again; shop writes on.
	stop = run()
	defer stop()
	for i := 20; i < 30; i++ {
		write(shop, i, shopAt.Add(time.Duration(i)*time.Second))
	}
	watch(4*time.Second, shopAt.Add(29*time.Second))
}
