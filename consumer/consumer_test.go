package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// topicOf names the Kafka topic of a scenario table.
func topicOf(target string) string { return "src." + target }

func encodeEvent(ev *change.Event, spec sink.TableSpec) (key, value []byte) {
	return scdtest.Debezium(ev, spec.Keys)
}

func newKafka(t *testing.T, partitions int32, topics ...string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func produce(t *testing.T, addrs []string, recs []*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic("unused"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
}

func rulesFor(specs []sink.TableSpec) []debezium.Rule {
	var rules []debezium.Rule
	for _, s := range specs {
		rules = append(rules, debezium.Rule{Topic: topicOf(s.Target), Target: s.Target, Keys: s.Keys,
			SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"})
	}
	return rules
}

type runner struct {
	cancel context.CancelFunc
	done   chan error
}

// start runs a consumer over a real sink until stopped.
func start(t *testing.T, addrs []string, pool *pgxpool.Pool, schema string, specs []sink.TableSpec, window time.Duration) *runner {
	t.Helper()
	return startWith(t, addrs, pool, schema, specs, window, nil)
}

// startWith is start with the consumer's configuration adjusted by tweak.
func startWith(t *testing.T, addrs []string, pool *pgxpool.Pool, schema string, specs []sink.TableSpec, window time.Duration, tweak func(*consumer.Config)) *runner {
	t.Helper()
	s, err := sink.New(sink.Config{Schema: schema, Tables: specs, ConsumerGroup: "g"}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg := consumer.Config{Brokers: addrs, GroupID: "g", ClientID: "test", StartOffset: "earliest",
		Rules: rulesFor(specs), ReorderWindow: window, MaxBufferedEvents: 1000, BatchMaxEvents: 50,
		BatchMaxWait: 20 * time.Millisecond}
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := consumer.New(cfg, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx, 30*time.Second) }()
	return r
}

func (r *runner) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("consumer: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("consumer did not drain in 60s")
	}
}

// waitApplied waits until scd2sink_offsets reaches every partition's end.
func waitApplied(t *testing.T, pool *pgxpool.Pool, schema string, want map[string]int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		got := map[string]int64{}
		rows, err := pool.Query(context.Background(), "SELECT topic, sum(next_offset) FROM "+schema+".scd2sink_offsets GROUP BY topic")
		if err == nil {
			for rows.Next() {
				var topic string
				var n int64
				if rows.Scan(&topic, &n) == nil {
					got[topic] = n
				}
			}
			rows.Close()
		}
		ok := true
		for topic, n := range want {
			ok = ok && got[topic] >= n
		}
		if ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("offsets never reached %v", want)
}

// TestEndToEnd produces random histories in random order, in waves (so some
// events arrive long after the reorder window), with duplicates, and checks
// the history tables against the reference fold.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			schema := fmt.Sprintf("e2e%d", seed)
			sc := scdtest.GenScenario(rng, schema)
			specOf := map[string]sink.TableSpec{}
			var topics []string
			for _, s := range sc.Specs {
				specOf[s.Target] = s
				topics = append(topics, topicOf(s.Target))
			}
			kafka := newKafka(t, 3, topics...)
			var recs []*kgo.Record
			for _, ev := range sc.Events {
				k, v := encodeEvent(ev, specOf[ev.Table])
				recs = append(recs, &kgo.Record{Topic: topicOf(ev.Table), Key: k, Value: v})
				if rng.IntN(6) == 0 {
					recs = append(recs, &kgo.Record{Topic: topicOf(ev.Table), Key: k, Value: v})
				}
			}
			inOrder := seed%3 == 0
			if !inOrder {
				rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
			}
			r := start(t, kafka.ListenAddrs(), pool, schema, sc.Specs, 100*time.Millisecond)
			want := map[string]int64{}
			for i := 0; i < len(recs); {
				n := min(1+rng.IntN(len(recs)), len(recs)-i)
				produce(t, kafka.ListenAddrs(), recs[i:i+n])
				for _, rec := range recs[i : i+n] {
					want[rec.Topic]++
				}
				i += n
				if !inOrder {
					time.Sleep(150 * time.Millisecond) // longer than the reorder window
				}
			}
			waitApplied(t, pool, schema, want)
			r.stop(t)
			check(t, pool, sc)

			// Replay everything: the group back to the start, the recorded
			// offsets gone. The history must not change.
			cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
			if err != nil {
				t.Fatal(err)
			}
			adm := kadm.NewClient(cl)
			zero := kadm.Offsets{}
			for _, tp := range topics {
				for p := int32(0); p < 3; p++ {
					zero.AddOffset(tp, p, 0, -1)
				}
			}
			if resp, err := adm.CommitOffsets(context.Background(), "g", zero); err != nil || resp.Error() != nil {
				t.Fatalf("rewinding the group: %v %v", err, resp.Error())
			}
			cl.Close()
			if _, err := pool.Exec(context.Background(), "DELETE FROM "+schema+".scd2sink_offsets"); err != nil {
				t.Fatal(err)
			}
			r = start(t, kafka.ListenAddrs(), pool, schema, sc.Specs, 100*time.Millisecond)
			waitApplied(t, pool, schema, want)
			r.stop(t)
			check(t, pool, sc)
		})
	}
}

func check(t *testing.T, pool *pgxpool.Pool, sc scdtest.Scenario) {
	t.Helper()
	s, err := sink.New(sink.Config{Schema: sc.Specs[0].Schema, Tables: sc.Specs}, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range sc.Specs {
		cols := sc.Cols[spec.Target]
		want := scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, sc.Events))
		got := scdtest.HistoryLines(t, pool, spec, cols)
		if d := scdtest.DiffLines(want, got); d != "" {
			t.Errorf("%s differs from the fold:\n%s", spec.Target, d)
		}
		vs, err := s.Verify(context.Background(), spec.Target)
		if err != nil || len(vs) > 0 {
			t.Errorf("verify %s: %v %v", spec.Target, err, vs)
		}
	}
}
