package consumer_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestFetchSizeFollowsCompression: Debezium's JSON with schemas, produced
// with lz4 as connectors often are, decompresses about 20 times; the
// fetches the consumer sends must then ask for that much less than the
// 1 MiB they ask for uncompressed, and everything must still be applied,
// to the same history.
func TestFetchSizeFollowsCompression(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	work := scdtest.BenchWorkload(rand.New(rand.NewPCG(3, 4)), 1_000, 3_000) // about 13 MiB of records
	histories := map[string]string{}
	for _, tc := range []struct {
		name        string
		codec       kgo.CompressionCodec
		least, most int32 // the smallest fetch size asked must be in [least, most]
	}{
		{"none", kgo.NoCompression(), 1 << 20, 1 << 20},
		{"lz4", kgo.Lz4Compression(), 64 << 10, 256 << 10},
		{"zstd", kgo.ZstdCompression(), 64 << 10, 256 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schema := "fetch_" + tc.name
			topics, specs, rules := benchTables(schema)
			kafka := newKafka(t, 3, topics...)
			var smallest atomic.Int32
			smallest.Store(math.MaxInt32)
			kafka.ControlKey(int16(kmsg.Fetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
				kafka.KeepControl()
				// (franz-go closes a fetch session with a fetch of 1 byte)
				if m := kr.(*kmsg.FetchRequest).MaxBytes; m > 1 && m < smallest.Load() {
					smallest.Store(m)
				}
				return nil, nil, false
			})
			want := produceWork(t, kafka.ListenAddrs(), work, kgo.ProducerBatchCompression(tc.codec), kgo.ProducerBatchMaxBytes(1<<20))
			r := startWith(t, kafka.ListenAddrs(), pool, schema, specs, 50*time.Millisecond, func(c *consumer.Config) {
				c.Rules, c.MaxBufferedEvents, c.BatchMaxEvents = rules, 100_000, 2_000
			})
			waitApplied(t, pool, schema, want)
			r.stop(t)
			if got := smallest.Load(); got < tc.least || got > tc.most {
				t.Errorf("the smallest fetch asked for %d bytes, want %d to %d", got, tc.least, tc.most)
			}
			// Every column of every version but the identity, which
			// follows the order of the inserts.
			var n int64
			var digest string
			if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*), md5(string_agg(v, '|' ORDER BY v)) FROM (
				SELECT 'c' || (to_jsonb(c) - 'scd_id')::text v FROM %[1]s.customers_history c
				UNION ALL SELECT 'a' || (to_jsonb(a) - 'scd_id')::text FROM %[1]s.accounts_history a) h`, schema)).Scan(&n, &digest); err != nil {
				t.Fatal(err)
			}
			histories[tc.name] = digest
			if n == 0 || (histories["none"] != "" && digest != histories["none"]) {
				t.Errorf("%d versions; the history differs from the uncompressed run's", n)
			}
			t.Logf("%s: fetches down to %d KiB, %d versions", tc.name, smallest.Load()>>10, n)
		})
	}
}

// TestIdleBrokersDoNotStallFetching: a backlog in partitions led by one
// broker, with the topics' other partitions idle on other brokers. A
// broker with nothing to send holds its fetch for FetchMaxWait (250 ms);
// with a single fetch allowed in flight for the whole client, every round
// of fetches waited for the idle brokers, and the backlog came at about one
// fetch (1 MiB) per round. Each broker has a fetch of its own now.
func TestIdleBrokersDoNotStallFetching(t *testing.T) {
	pool := newPool(t)
	work := scdtest.BenchWorkload(rand.New(rand.NewPCG(5, 6)), 2_000, 6_000) // about 26 MiB of records
	const schema = "idle_brokers"
	topics, specs, rules := benchTables(schema)
	kafka, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	// Everything in partition 0: partitions 1 and 2, led by the other
	// brokers, stay idle.
	want := produceWork(t, kafka.ListenAddrs(), work, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	began := time.Now()
	r := startWith(t, kafka.ListenAddrs(), pool, schema, specs, 50*time.Millisecond, func(c *consumer.Config) {
		c.Rules = rules
	})
	waitApplied(t, pool, schema, want)
	took := time.Since(began)
	r.stop(t)
	t.Logf("%d records applied in %v", len(work), took.Round(time.Millisecond))
	// With one fetch in flight for the client it took 6.4 s here; a
	// fetch per broker, 0.8 s.
	if took > 4*time.Second {
		t.Fatalf("the backlog took %v: the idle brokers' fetches held it back", took)
	}
}

// benchTables returns the benchmark workload's two tables in schema: their
// topics, table specs and decoding rules.
func benchTables(schema string) (topics []string, specs []sink.TableSpec, rules []debezium.Rule) {
	for _, src := range []*scdtest.Source{scdtest.BenchCustomers(), scdtest.BenchAccounts()} {
		topics = append(topics, src.Topic())
		specs = append(specs, sink.TableSpec{Target: src.Table + "_history", Schema: schema, Keys: []string{"id"},
			TrackHistory: scdtest.BenchTracked[src.Table]})
		rules = append(rules, debezium.Rule{Topic: src.Topic(), Target: src.Table + "_history", Keys: []string{"id"},
			SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"})
	}
	return topics, specs, rules
}

// newPool opens a pool on a fresh test database.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// produceWork produces the workload's records with the client options
// given (to partition 0 under a manual partitioner) and returns how many
// went to each topic.
func produceWork(t *testing.T, addrs []string, work []scdtest.BenchRecord, opts ...kgo.Opt) map[string]int64 {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	want := map[string]int64{}
	for _, w := range work {
		k, v := w.Src.Envelope(w.Change)
		if w.Tombstone {
			v = nil
		}
		cl.Produce(context.Background(), &kgo.Record{Topic: w.Src.Topic(), Partition: 0, Key: k, Value: v}, nil)
		want[w.Src.Topic()]++
	}
	if err := cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	return want
}
