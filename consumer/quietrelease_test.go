package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
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
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rng := rand.New(rand.NewPCG(5, 17))
	sc := scdtest.GenScenario(rng, "quiet")
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
	t.Logf("%d repairs of events that came after their keys' later ones were released", repairs)
}
