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
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestAbortedTransactions: Debezium's exactly-once source mode writes in
// Kafka transactions. Records of an aborted one never reach PostgreSQL
// (neither as versions nor as dead letters) under the default
// read_committed; committed ones do. read_uncommitted, asked for, reads
// both (which shows the test can tell).
func TestAbortedTransactions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		level       string
		wantAborted int
	}{{"", 0}, {"read_uncommitted", 20}} {
		name := tc.level
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			spec := sink.TableSpec{Target: "acct_history", Schema: "public", Keys: []string{"acct_id"},
				Columns: []sink.Column{{Name: "acct_id", Type: "text"}, {Name: "plan", Type: "text"}}}
			kafka := newKafka(t, 1, topicOf(spec.Target))
			pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.TransactionalID("debezium-eos"),
				kgo.DefaultProduceTopic(topicOf(spec.Target)))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			txn := func(prefix string, n int, seq0 int64, commit bool) {
				t.Helper()
				if err := cl.BeginTransaction(); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < n; i++ {
					id := fmt.Sprintf("%s%d", prefix, i)
					ev := &change.Event{Table: spec.Target, Key: []any{id}, Op: change.OpCreate, Seq: change.MustSeq(seq0 + int64(i)),
						ValidFrom: time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC), After: map[string]any{"acct_id": id, "plan": "pro"}}
					k, v := encodeEvent(ev, spec)
					if err := cl.ProduceSync(ctx, &kgo.Record{Key: k, Value: v}).FirstErr(); err != nil {
						t.Fatal(err)
					}
				}
				if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
					t.Fatal(err)
				}
			}
			txn("aborted-", 20, 100, false)
			txn("committed-", 5, 200, true)

			r := startWith(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 20*time.Millisecond,
				func(c *consumer.Config) { c.IsolationLevel = tc.level })
			deadline := time.Now().Add(30 * time.Second)
			count := func(q string) int {
				var n int
				if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
					return -1
				}
				return n
			}
			for count(`SELECT count(*) FROM acct_history WHERE acct_id LIKE 'committed-%'`) < 5 {
				if time.Now().After(deadline) {
					t.Fatal("the committed transaction's records were not applied")
				}
				time.Sleep(50 * time.Millisecond)
			}
			// Each transaction ends in a marker taking an offset: 20
			// aborted records, a marker, 5 committed, a marker. The offset
			// recorded passes the last marker, or the partition would
			// never count as read to its end (the watermark) and the
			// marker would be fetched again after every restart.
			for count(`SELECT next_offset FROM scd2sink_offsets`) != 27 {
				if time.Now().After(deadline) {
					t.Fatalf("offset recorded %d, want 27 (past the commit marker)", count(`SELECT next_offset FROM scd2sink_offsets`))
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond) // room for anything still to come
			r.stop(t)
			if got := count(`SELECT count(*) FROM acct_history WHERE acct_id LIKE 'aborted-%'`); got != tc.wantAborted {
				t.Errorf("%d versions from the aborted transaction, want %d", got, tc.wantAborted)
			}
			if got := count(`SELECT count(*) FROM scd2sink_dead_letters`); got != 0 {
				t.Errorf("%d dead letters", got)
			}
		})
	}
}
