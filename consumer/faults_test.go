package consumer_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// rig is a Kafka (kfake), a database and a random scenario to push through.
type rig struct {
	kafka  *kfake.Cluster
	pool   *pgxpool.Pool
	schema string
	sc     scdtest.Scenario
	recs   []*kgo.Record
	want   map[string]int64
}

func newRig(t *testing.T, seed uint64, scenarios int, partitions int32) *rig {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	sc := scdtest.BigScenario(rng, "public", scenarios)
	var topics []string
	specOf := map[string]sink.TableSpec{}
	for _, s := range sc.Specs {
		topics = append(topics, topicOf(s.Target))
		specOf[s.Target] = s
	}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	pool, err := pgxpool.New(context.Background(), pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r := &rig{kafka: kafka, pool: pool, schema: "public", sc: sc, want: map[string]int64{}}
	for _, ev := range sc.Events {
		k, v := encodeEvent(ev, specOf[ev.Table])
		r.recs = append(r.recs, &kgo.Record{Topic: topicOf(ev.Table), Key: k, Value: v})
		r.want[topicOf(ev.Table)]++
	}
	rng.Shuffle(len(r.recs), func(i, j int) { r.recs[i], r.recs[j] = r.recs[j], r.recs[i] })
	return r
}

func (r *rig) consumer(t *testing.T, opts ...kgo.Opt) *runner {
	t.Helper()
	s, err := sink.New(sink.Config{Schema: r.schema, Tables: r.sc.Specs, ConsumerGroup: "g", MaxRetries: 3}, r.pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{Brokers: r.kafka.ListenAddrs(), GroupID: "g", ClientID: "test", StartOffset: "earliest",
		SessionTimeout: 2 * time.Second, Rules: rulesFor(r.sc.Specs), ReorderWindow: 30 * time.Millisecond,
		MaxBufferedEvents: 500, BatchMaxEvents: 100, BatchMaxWait: 20 * time.Millisecond, Opts: opts}, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &runner{cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- c.Run(ctx, 30*time.Second) }()
	return run
}

func (r *rig) produce(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	produce(t, r.kafka.ListenAddrs(), recs)
}

// TestPoison: every kind of bad record becomes one dead-letter row with a
// clear error, and the good records around it are applied.
func TestPoison(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1, 3, 2)
	topic := topicOf("acct_history")
	key := []byte(`{"acct_id":"P1"}`)
	poison := []struct{ value, want string }{
		{`{"op":"c","after":`, "not Debezium JSON"},
		{`{"after":{"acct_id":"P1"},"source":{"lsn":1,"ts_ms":1}}`, "no op"},
		{`{"op":"z","after":{"acct_id":"P1"},"source":{"lsn":1,"ts_ms":1}}`, "unknown operation"},
		{`{"op":"u","after":{"acct_id":"P1"},"source":{"ts_ms":1}}`, "sequence path source.lsn is missing"},
		{`{"op":"u","after":{"plan":"x"},"source":{"lsn":1,"ts_ms":1}}`, "key column acct_id is missing"},
		{"\x00\xff\xfe garbage", "not Debezium JSON"},
	}
	var recs []*kgo.Record
	for i, p := range poison {
		k := key
		if i == 4 {
			k = nil
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: k, Value: []byte(p.value)})
	}
	r.want[topic] += int64(len(recs))
	recs = append(recs, r.recs...)
	run := r.consumer(t)
	r.produce(t, recs)
	waitApplied(t, r.pool, r.schema, r.want)
	run.stop(t)
	check(t, r.pool, r.sc)
	rows, err := r.pool.Query(context.Background(), `SELECT error FROM scd2sink_dead_letters ORDER BY "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	var errs []string
	for rows.Next() {
		var e string
		_ = rows.Scan(&e)
		errs = append(errs, e)
	}
	if len(errs) != len(poison) {
		t.Fatalf("%d dead letters, want %d: %q", len(errs), len(poison), errs)
	}
	for _, p := range poison {
		found := false
		for _, e := range errs {
			found = found || strings.Contains(e, p.want)
		}
		if !found {
			t.Errorf("no dead letter mentions %q: %q", p.want, errs)
		}
	}
}

// TestRebalance: two members share six partitions while events are
// produced; one leaves, later a third joins. The history equals the fold.
func TestRebalance(t *testing.T) {
	r := newRig(t, 2, 40, 6)
	third := len(r.recs) / 3
	a, b := r.consumer(t), r.consumer(t)
	r.produce(t, r.recs[:third])
	time.Sleep(500 * time.Millisecond)
	b.stop(t)
	r.produce(t, r.recs[third:2*third])
	c := r.consumer(t)
	time.Sleep(300 * time.Millisecond)
	r.produce(t, r.recs[2*third:])
	waitApplied(t, r.pool, r.schema, r.want)
	a.stop(t)
	c.stop(t)
	check(t, r.pool, r.sc)
}

// TestFaults: PostgreSQL connections are terminated while batches are
// applied, and Kafka drops Fetch and OffsetCommit requests; nothing is lost
// or doubled.
func TestFaults(t *testing.T) {
	t.Parallel()
	r := newRig(t, 3, 40, 3)
	var fetches, commits atomic.Int64
	r.kafka.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		r.kafka.KeepControl()
		if fetches.Add(1)%3 == 0 {
			return nil, errors.New("injected fetch failure"), true
		}
		return nil, nil, false
	})
	r.kafka.ControlKey(int16(kmsg.OffsetCommit), func(kmsg.Request) (kmsg.Response, error, bool) {
		r.kafka.KeepControl()
		if commits.Add(1)%3 == 0 {
			return nil, errors.New("injected commit failure"), true
		}
		return nil, nil, false
	})
	run := r.consumer(t)
	stop := make(chan struct{})
	killed := make(chan int64)
	var terminated atomic.Int64
	go func() {
		defer func() { killed <- terminated.Load() }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(25 * time.Millisecond):
			}
			var k int64
			_ = r.pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&k)
			terminated.Add(k)
		}
	}()
	for i := 0; i < len(r.recs); i += 200 {
		r.produce(t, r.recs[i:min(i+200, len(r.recs))])
		time.Sleep(50 * time.Millisecond)
	}
	// Connections are terminated while the records are produced and
	// applied, and after until 30 were or 3 s passed; then no more, so
	// that the test ends on a slow machine too (where a transaction may
	// rarely fit between two terminations 25 ms apart).
	for until := time.Now().Add(3 * time.Second); terminated.Load() < 30 && time.Now().Before(until); {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	n := <-killed
	fresh, err := pgxpool.New(context.Background(), r.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	waitApplied(t, fresh, r.schema, r.want)
	run.stop(t)
	t.Logf("terminated %d backends, failed %d of %d fetches and %d of %d commits", n, fetches.Load()/3, fetches.Load(), commits.Load()/3, commits.Load())
	if n == 0 || commits.Load() < 3 || fetches.Load() < 3 {
		t.Fatalf("the faults did not happen (%d backends, %d commits)", n, commits.Load())
	}
	after, err := pgxpool.New(context.Background(), r.pool.Config().ConnString()) // fresh's connections were terminated too
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	check(t, after, r.sc)
}
