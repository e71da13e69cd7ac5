package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestTinyBufferStaysExact: with a byte budget of a few events the reorder
// buffer releases almost everything before its window ends, so events of a
// key that arrive out of order reach the sink late and are repaired. The
// history must still be the reference fold's, and the early releases must
// show in their metric.
func TestTinyBufferStaysExact(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			schema := fmt.Sprintf("tiny%d", seed)
			sc := scdtest.GenScenario(rng, schema)
			specOf := map[string]sink.TableSpec{}
			var topics []string
			for _, s := range sc.Specs {
				specOf[s.Target] = s
				topics = append(topics, topicOf(s.Target))
			}
			kafka := newKafka(t, 3, topics...)
			var recs []*kgo.Record
			want := map[string]int64{}
			for _, ev := range sc.Events {
				k, v := encodeEvent(ev, specOf[ev.Table])
				recs = append(recs, &kgo.Record{Topic: topicOf(ev.Table), Key: k, Value: v})
				want[topicOf(ev.Table)]++
			}
			rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
			produce(t, kafka.ListenAddrs(), recs)
			m := consumer.NewMetrics(nil)
			r := startWith(t, kafka.ListenAddrs(), pool, schema, sc.Specs, 2*time.Second, func(c *consumer.Config) {
				c.MaxBufferedBytes = 2048 // a few events
				c.Metrics = m
			})
			waitApplied(t, pool, schema, want) // the last few, under the budget, wait out the window
			r.stop(t)
			check(t, pool, sc)
			if early := testutil.ToFloat64(m.ReleasedEarly); early == 0 {
				t.Fatal("no event was released early: the budget was not exercised")
			}
		})
	}
}
