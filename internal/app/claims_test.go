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
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"
)

// TestTargetClaims: two members of a group, one topic_pattern entry whose
// target template gives two new topics (shop.public.orders and
// shop.sales.orders, created while both run, one partition each) one
// target. Each member resolves the topics it is assigned in its own
// order; scd2sink_targets makes them agree: exactly one topic's events
// reach orders_history, the other is skipped by whoever holds it. When
// the member applying the winner stops, the other member takes both
// topics and goes on applying the winner (even though it had resolved
// the loser first) and never the loser.
func TestTargetClaims(t *testing.T) {
	t.Parallel()
	pub, sales := patternSource("public", "orders"), patternSource("sales", "orders")
	seed := patternSource("public", "seed")
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, seed.Topic()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	producePlans(t, cl, seed, 1)
	dsn := pgtest.NewDatabase(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	member := func(name string) (stop func()) {
		t.Helper()
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, metadata_max_age: 300ms, session_timeout: 6s}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 10ms}
sink: {batch_max_wait: 10ms}
tables:
  - topic_pattern: 'shop\.[a-z]+\.[a-z]+'
`, brokers, dsn)), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Run(ctx, cfg, Options{Logger: zaptest.NewLogger(t).Named(name), LeaveGroup: true}) }()
		var once bool
		stop = func() {
			if once {
				return
			}
			once = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("member %s: %v", name, err)
			}
		}
		t.Cleanup(stop)
		return stop
	}
	stop1 := member("one")
	member("two")
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	query := func(q string) int {
		var n int
		if err := pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	waitFor := func(what, q string, want int, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for query(q) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d, want %d", what, query(q), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("seed versions", `SELECT count(*) FROM seed_history`, 1, 30*time.Second)

	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(context.Background(), 1, 1, nil, pub.Topic()); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreateTopic(context.Background(), 1, 1, nil, sales.Topic()); err != nil {
		t.Fatal(err)
	}
	producePlans(t, cl, pub, 4)   // ids 0-3
	producePlans(t, cl, sales, 6) // ids 0-5
	waitFor("claims", `SELECT count(*) FROM scd2sink_targets WHERE target = 'orders_history'`, 1, 30*time.Second)
	var winner string
	if err := pool.QueryRow(context.Background(), `SELECT topic FROM scd2sink_targets WHERE target = 'orders_history'`).Scan(&winner); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{pub.Topic(): 4, sales.Topic(): 6}[winner]
	waitFor("orders_history versions", `SELECT count(*) FROM orders_history`, want, 30*time.Second)
	time.Sleep(time.Second) // room for the loser's events, were they applied
	if got := query(`SELECT count(*) FROM orders_history`); got != want {
		t.Fatalf("orders_history holds %d versions, want the %d of %s alone", got, want, winner)
	}

	// The first member leaves: the second holds both topics now.
	stop1()
	producePlans(t, cl, pub, 8)   // ids 4-7 are new
	producePlans(t, cl, sales, 9) // ids 6-8 are new
	want = map[string]int{pub.Topic(): 8, sales.Topic(): 9}[winner]
	waitFor("orders_history versions after the rebalance", `SELECT count(*) FROM orders_history`, want, 30*time.Second)
	time.Sleep(time.Second)
	if got := query(`SELECT count(*) FROM orders_history`); got != want {
		t.Fatalf("orders_history holds %d versions after the rebalance, want the %d of %s alone", got, want, winner)
	}
	if n := query(`SELECT count(*) FROM scd2sink_dead_letters`); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	if n := query(fmt.Sprintf(`SELECT count(*) FROM scd2sink_offsets WHERE topic IN ('%s', '%s') AND topic <> '%s'`, pub.Topic(), sales.Topic(), winner)); n != 0 {
		t.Errorf("offsets recorded for the topic that lost the target")
	}
}
