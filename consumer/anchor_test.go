package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Incremental-snapshot reads carry no sequence: each is ordered after
// everything before it in its partition, across restarts (the anchor is
// recorded with the offsets), and a replay from the start changes nothing.
func TestSnapshotReadsWithoutSequence(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	spec := sink.TableSpec{Target: "items_history", Schema: "public", Keys: []string{"id"}}
	topic := topicOf(spec.Target)
	kafka := newKafka(t, 1, topic)
	rec := func(id int, lsn int64, plan string, minute int) *kgo.Record {
		src := fmt.Sprintf(`{"version":"3.6.1.Final","connector":"postgresql","name":"src","ts_ms":%d,"snapshot":"false","db":"src","schema":"public","table":"items","lsn":%d}`,
			time.Date(2026, 3, 1, 0, minute, 0, 0, time.UTC).UnixMilli(), lsn)
		op := "u"
		if lsn == 0 { // an incremental-snapshot read: no LSN
			op = "r"
			src = fmt.Sprintf(`{"version":"3.6.1.Final","connector":"postgresql","name":"src","ts_ms":%d,"snapshot":"incremental","db":"src","schema":"public","table":"items","lsn":null}`,
				time.Date(2026, 3, 1, 0, minute, 0, 0, time.UTC).UnixMilli())
		}
		return &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf(`{"id":%d}`, id)),
			Value: []byte(fmt.Sprintf(`{"before":null,"after":{"id":%d,"plan":%q},"source":%s,"op":%q,"ts_ms":1}`, id, plan, src, op))}
	}
	history := func() string {
		var got string
		if err := pool.QueryRow(context.Background(), `SELECT string_agg(id || ':' || plan || ':' || to_char(valid_from, 'MI') || ':' || is_current, ' ' ORDER BY id, valid_from)
			FROM items_history`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	produce(t, kafka.ListenAddrs(), []*kgo.Record{
		rec(2, 0, "first", 1), // nothing before it in the partition
		rec(1, 100, "basic", 1), rec(1, 200, "pro", 2), rec(1, 0, "snap", 3), rec(1, 300, "team", 4),
	})
	r := start(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 50*time.Millisecond)
	waitApplied(t, pool, "public", map[string]int64{topic: 5})
	r.stop(t)
	if got, want := history(), "1:basic:01:false 1:pro:02:false 1:snap:03:false 1:team:04:true 2:first:01:true"; got != want {
		t.Fatalf("history\n got %s\nwant %s", got, want)
	}
	// Restarted from the recorded offset, a read without a sequence that
	// comes first is anchored by what scd2sink_offsets recorded.
	produce(t, kafka.ListenAddrs(), []*kgo.Record{rec(1, 0, "snap2", 5), rec(1, 400, "team2", 6)})
	r = start(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 50*time.Millisecond)
	waitApplied(t, pool, "public", map[string]int64{topic: 7})
	r.stop(t)
	want := "1:basic:01:false 1:pro:02:false 1:snap:03:false 1:team:04:false 1:snap2:05:false 1:team2:06:true 2:first:01:true"
	if got := history(); got != want {
		t.Fatalf("after a restart\n got %s\nwant %s", got, want)
	}
	// A replay of the whole topic (the group rewound, the recorded
	// offsets gone) changes nothing.
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	zero := kadm.Offsets{}
	zero.AddOffset(topic, 0, 0, -1)
	if resp, err := kadm.NewClient(cl).CommitOffsets(context.Background(), "g", zero); err != nil || resp.Error() != nil {
		t.Fatalf("rewinding the group: %v %v", err, resp.Error())
	}
	cl.Close()
	if _, err := pool.Exec(context.Background(), "DELETE FROM scd2sink_offsets"); err != nil {
		t.Fatal(err)
	}
	r = start(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 50*time.Millisecond)
	waitApplied(t, pool, "public", map[string]int64{topic: 7})
	r.stop(t)
	if got := history(); got != want {
		t.Fatalf("after a replay\n got %s\nwant %s", got, want)
	}
}
