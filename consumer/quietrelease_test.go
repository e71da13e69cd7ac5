package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestQuietInputIsReleased: with a reorder window of a minute, a burst of
// changes (random order over three partitions, duplicates) is applied
// once every partition is read to its end and nothing more comes, long
// before the window ends; the history equals the fold. A second burst,
// some of its events earlier than what the first applied, is repaired
// into the same exact history.
func TestQuietInputIsReleased(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 17))
	pool, sc, kafka, recs := quietScenario(t, rng, "quiet", true)
	rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	half := len(recs) / 2
	r := start(t, kafka.ListenAddrs(), pool, "quiet", sc.Specs, time.Minute)
	defer r.stop(t)
	want := map[string]int64{}
	for i, burst := range [][]*kgo.Record{recs[:half], recs[half:]} {
		began := time.Now()
		produce(t, kafka.ListenAddrs(), burst)
		for _, rec := range burst {
			want[rec.Topic]++
		}
		waitApplied(t, pool, "quiet", want)
		if took := time.Since(began); took > 20*time.Second {
			t.Fatalf("burst %d applied after %v: the minute's window was waited out", i+1, took)
		} else {
			t.Logf("burst %d (%d records) applied %v after it was produced, with a reorder window of a minute", i+1, len(burst), took.Round(time.Millisecond))
		}
	}
	check(t, pool, sc)
	var repairs int
	for _, s := range sc.Specs {
		var n int
		if err := pool.QueryRow(context.Background(), fmt.Sprintf("SELECT count(*) FROM quiet.%s_scd_repairs", s.Target)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		repairs += n
	}
	if repairs == 0 {
		t.Error("no repair: the second burst brought no event earlier than what the first applied")
	}
	t.Logf("%d repairs of events that came after their keys' later ones were released", repairs)
}

// TestQuietReleaseOff: with sequencer.quiet_after 0 (a negative
// QuietAfter) a quiet input's events wait out their window.
func TestQuietReleaseOff(t *testing.T) {
	t.Parallel()
	pool, sc, kafka, recs := quietScenario(t, rand.New(rand.NewPCG(6, 17)), "off", false)
	window := 4 * time.Second
	r := startWith(t, kafka.ListenAddrs(), pool, "off", sc.Specs, window, func(c *consumer.Config) { c.QuietAfter = -1 })
	defer r.stop(t)
	began := time.Now()
	produce(t, kafka.ListenAddrs(), recs)
	time.Sleep(window / 2)
	var applied int64
	if err := pool.QueryRow(context.Background(), "SELECT coalesce(sum(next_offset), 0) FROM off.scd2sink_offsets").Scan(&applied); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{}
	for _, rec := range recs {
		want[rec.Topic]++
	}
	if applied >= int64(len(recs))/2 {
		// (a truncate waits for no key: it may go at once)
		t.Fatalf("%d of %d records applied %v after they were produced, within the window of %v", applied, len(recs), time.Since(began).Round(time.Millisecond), window)
	}
	waitApplied(t, pool, "off", want)
	if took := time.Since(began); took < window {
		t.Fatalf("applied after %v, before the window of %v", took, window)
	}
	check(t, pool, sc)
}

// quietScenario makes a database, a random scenario in schema, an
// in-process Kafka of three partitions per topic, and the scenario's
// records in event order (some twice, with dups).
func quietScenario(t *testing.T, rng *rand.Rand, schema string, dups bool) (*pgxpool.Pool, scdtest.Scenario, *kfake.Cluster, []*kgo.Record) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
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
		if dups && rng.IntN(6) == 0 {
			recs = append(recs, &kgo.Record{Topic: topicOf(ev.Table), Key: k, Value: v})
		}
	}
	return pool, sc, kafka, recs
}
