package consumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestUnsettledTopic: while Route cannot tell whether a topic may be
// applied (PostgreSQL, which holds the target claims, is away) the topic
// is paused, nothing of it applied, and asked about again; once Route
// answers, it is resumed and applied in full. A topic Route refuses stays
// paused for good.
func TestUnsettledTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	okSpec := sink.TableSpec{Target: "acct_history", Schema: "public", Keys: []string{"acct_id"},
		Columns: []sink.Column{{Name: "acct_id", Type: "text"}, {Name: "plan", Type: "text"}}}
	badSpec := okSpec
	badSpec.Target = "bad_history"
	kafka := newKafka(t, 1, topicOf(okSpec.Target), topicOf(badSpec.Target))
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var recs []*kgo.Record
	for _, spec := range []sink.TableSpec{okSpec, badSpec} {
		for i := 0; i < 5; i++ {
			id := fmt.Sprintf("a%d", i)
			ev := &change.Event{Table: spec.Target, Key: []any{id}, Op: change.OpCreate, Seq: change.MustSeq(int64(10 + i)),
				ValidFrom: time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC), After: map[string]any{"acct_id": id, "plan": "pro"}}
			k, v := encodeEvent(ev, spec)
			recs = append(recs, &kgo.Record{Topic: topicOf(spec.Target), Key: k, Value: v})
		}
	}
	produce(t, kafka.ListenAddrs(), recs)
	var settled, asked atomic.Bool
	r := startWith(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{okSpec, badSpec}, 20*time.Millisecond,
		func(c *consumer.Config) {
			c.Route = func(_ context.Context, topic string) error {
				switch {
				case topic == topicOf(badSpec.Target):
					return fmt.Errorf("topic %s would write a target another topic writes", topic)
				case !settled.Load():
					asked.Store(true)
					return fmt.Errorf("%w: PostgreSQL is away", consumer.ErrUnsettled)
				}
				return nil
			}
		})
	defer r.stop(t)
	count := func(table string) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			return 0 // not created yet
		}
		return n
	}
	time.Sleep(2 * time.Second)
	if !asked.Load() {
		t.Fatal("Route was never asked")
	}
	if n := count("acct_history"); n != 0 {
		t.Fatalf("%d versions applied while the topic was unsettled", n)
	}
	settled.Store(true)
	for deadline := time.Now().Add(20 * time.Second); count("acct_history") < 5; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the settled topic was not applied: %d versions", count("acct_history"))
		}
	}
	time.Sleep(500 * time.Millisecond)
	if n := count("bad_history"); n != 0 {
		t.Errorf("%d versions of the refused topic", n)
	}
}
