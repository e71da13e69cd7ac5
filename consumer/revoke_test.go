package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRebalanceWhileBlocked: a member's batch keeps retrying (its history
// table is locked by another session, every statement gives up after
// lock_timeout) when a second member joins. The rebalance must not wait for
// the lock: within the revoke budget the first member abandons the batch
// and gives the partitions up, and the group is stable with both members
// while the lock is still held. Once it is released, everything is
// applied exactly once into the history and every offset is recorded.
func TestRebalanceWhileBlocked(t *testing.T) {
	ctx := context.Background()
	spec := sink.TableSpec{Target: "acct_history", Schema: "public", Keys: []string{"acct_id"},
		Columns: []sink.Column{{Name: "acct_id", Type: "text"}, {Name: "plan", Type: "text"}}}
	topic := topicOf(spec.Target)
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	dsn := pgtest.NewDatabase(t)
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["lock_timeout"] = "200"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	records := func(from, to int) []*kgo.Record {
		var recs []*kgo.Record
		for i := from; i < to; i++ {
			id := fmt.Sprintf("k%03d", i)
			ev := &change.Event{Table: spec.Target, Key: []any{id}, Op: change.OpCreate, Seq: change.MustSeq(int64(1000 + i)),
				ValidFrom: time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC), After: map[string]any{"acct_id": id, "plan": "pro"}}
			k, v := encodeEvent(ev, spec)
			recs = append(recs, &kgo.Record{Topic: topic, Key: k, Value: v})
		}
		return recs
	}
	// Heartbeats every second: members learn of the rebalance soon.
	// The revoke budget is 2 s.
	session := func(c *consumer.Config) {
		c.SessionTimeout = 3 * time.Second
		consumer.SetRevokeBudget(c, 2*time.Second)
	}
	produce(t, kafka.ListenAddrs(), records(0, 40))
	a := startWith(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 10*time.Millisecond, session)
	waitApplied(t, pool, "public", map[string]int64{topic: 40})

	// Another session locks the history table; the member's next batch
	// retries 55P03.
	lockConn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lockConn.Release()
	tx, err := lockConn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = 0; LOCK TABLE acct_history IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	produce(t, kafka.ListenAddrs(), records(40, 80))
	time.Sleep(500 * time.Millisecond) // the batch is retrying

	joined := time.Now()
	b := startWith(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 10*time.Millisecond, session)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	stable := false
	for deadline := time.Now().Add(12 * time.Second); !stable && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		groups, err := adm.DescribeGroups(ctx, "g")
		if err != nil {
			continue
		}
		g := groups["g"]
		if g.State != "Stable" || len(g.Members) != 2 {
			continue
		}
		stable = true
		for _, m := range g.Members {
			if as, ok := m.Assigned.AsConsumer(); !ok || len(as.Topics) == 0 || len(as.Topics[0].Partitions) == 0 {
				stable = false
			}
		}
	}
	took := time.Since(joined)
	if !stable {
		t.Fatalf("the group was not stable with two members %v after the second joined, the table still locked", took.Round(time.Millisecond))
	}
	t.Logf("group stable with both members %v after the second joined, the table still locked", took.Round(time.Millisecond))
	if took > 8*time.Second {
		t.Errorf("the rebalance took %v: it waited for the locked batch", took)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, pool, "public", map[string]int64{topic: 80})
	a.stop(t)
	b.stop(t)
	var versions, keys int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT acct_id) FROM acct_history`).Scan(&versions, &keys); err != nil {
		t.Fatal(err)
	}
	if versions != 80 || keys != 80 {
		t.Errorf("%d versions of %d keys, want 80 of 80", versions, keys)
	}
}
