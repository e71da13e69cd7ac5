package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
)

// TestOffsetsLost: a stored offset that is no longer in the log follows
// kafka.on_offset_lost, whatever start_offset says: retention deleted
// records before they were applied (DeleteRecords below the stored
// offset), or the topic was deleted and re-created (found by its topic ID
// even where the stale offset still falls inside the new log).
func TestOffsetsLost(t *testing.T) {
	t.Parallel()
	spec := sink.TableSpec{Target: "acct_history", Schema: "public", Keys: []string{"acct_id"},
		Columns: []sink.Column{{Name: "acct_id", Type: "text"}, {Name: "plan", Type: "text"}}}
	topic := topicOf(spec.Target)
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
	cases := []struct {
		name string
		// lose changes the log after keys 0..9 were applied (stored offset
		// 10) and returns the keys the log still holds beyond those.
		lose     func(t *testing.T, kafka *kfake.Cluster, adm *kadm.Client, pool *pgxpool.Pool) (first, end int)
		failWith []string
		// the offsets scd2sink_offsets holds afterwards, by policy
		earliest, latest int64
	}{
		{"retention passed the stored offset", func(t *testing.T, kafka *kfake.Cluster, adm *kadm.Client, _ *pgxpool.Pool) (int, int) {
			produce(t, kafka.ListenAddrs(), records(10, 20))
			var o kadm.Offsets
			o.Add(kadm.Offset{Topic: topic, Partition: 0, At: 15})
			resp, err := adm.DeleteRecords(context.Background(), o)
			if err == nil {
				err = resp.Error()
			}
			if err != nil {
				t.Fatalf("DeleteRecords: %v", err)
			}
			return 15, 20
		}, []string{"topic src.acct_history partition 0", "next offset to read (10)", "offsets 15 to 19", "on_offset_lost"}, 20, 20},
		{"topic deleted and re-created", func(t *testing.T, kafka *kfake.Cluster, adm *kadm.Client, _ *pgxpool.Pool) (int, int) {
			ctx := context.Background()
			if _, err := adm.DeleteTopics(ctx, topic); err != nil {
				t.Fatal(err)
			}
			if resp, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil || resp.Err != nil {
				t.Fatalf("re-creating: %v %v", err, resp.Err)
			}
			produce(t, kafka.ListenAddrs(), records(100, 103)) // offsets 0..2: below the stale 10
			return 100, 103
		}, []string{"topic src.acct_history was deleted and re-created", "on_offset_lost"}, 3, 3},
		// An unclean leader election: the log ends below the stored offset
		// (same topic ID). The offset placed must replace the stored one,
		// or a restart would skip from there to the stale offset.
		{"log truncated below the stored offset", func(t *testing.T, kafka *kfake.Cluster, adm *kadm.Client, pool *pgxpool.Pool) (int, int) {
			if _, err := pool.Exec(context.Background(), `UPDATE scd2sink_offsets SET next_offset = 30 WHERE topic = $1`, topic); err != nil {
				t.Fatal(err)
			}
			return 10, 10
		}, []string{"topic src.acct_history partition 0", "next offset to read (30)", "offsets 0 to 9"}, 10, 10},
	}
	for _, tc := range cases {
		for _, policy := range []string{"fail", "earliest", "latest"} {
			t.Run(tc.name+"/"+policy, func(t *testing.T) {
				ctx := context.Background()
				kafka := newKafka(t, 1, topic)
				pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(cl.Close)
				adm := kadm.NewClient(cl)
				tweak := func(c *consumer.Config) {
					c.OnOffsetLost = policy
					c.Logger = zaptest.NewLogger(t)
				}

				produce(t, kafka.ListenAddrs(), records(0, 10))
				r := startWith(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 10*time.Millisecond, tweak)
				waitOffset(t, pool, topic, 10)
				r.stop(t)
				first, end := tc.lose(t, kafka, adm, pool)

				r = startWith(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 10*time.Millisecond, tweak)
				switch policy {
				case "fail":
					var err error
					select {
					case err = <-r.done:
					case <-time.After(30 * time.Second):
						r.cancel()
						t.Fatal("the consumer went on past a lost offset")
					}
					if err == nil {
						t.Fatal("Run ended without an error")
					}
					for _, want := range tc.failWith {
						if !strings.Contains(err.Error(), want) {
							t.Errorf("the error does not say %q:\n%v", want, err)
						}
					}
					if got := keys(t, pool); got != span(0, 10) {
						t.Errorf("history holds %s, want only what was applied before", got)
					}
					return
				case "earliest":
					waitOffset(t, pool, topic, tc.earliest)
					if got := keys(t, pool); got != strings.TrimSpace(span(0, 10)+" "+span(first, end)) {
						t.Errorf("history holds %s, want keys 0..9 and what the log still held", got)
					}
				case "latest":
					waitOffset(t, pool, topic, tc.latest)
					produce(t, kafka.ListenAddrs(), records(200, 201))
					waitOffset(t, pool, topic, tc.latest+1)
					if got := keys(t, pool); got != span(0, 10)+" "+span(200, 201) {
						t.Errorf("history holds %s, want keys 0..9 and the one produced after", got)
					}
				}
				// Stopped and restarted: it goes on exactly where it was.
				r.stop(t)
				at := tc.earliest
				if policy == "latest" {
					at = tc.latest + 1
				}
				before := keys(t, pool)
				produce(t, kafka.ListenAddrs(), records(300, 305))
				r = startWith(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 10*time.Millisecond, tweak)
				waitOffset(t, pool, topic, at+5)
				if got := keys(t, pool); got != before+" "+span(300, 305) {
					t.Errorf("after a restart the history holds %s, want %s and keys 300..304", got, before)
				}
				r.stop(t)
			})
		}
	}
}

// waitOffset waits until scd2sink_offsets holds exactly want for topic's
// partition 0.
func waitOffset(t *testing.T, pool *pgxpool.Pool, topic string, want int64) {
	t.Helper()
	var got int64 = -1
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := pool.QueryRow(context.Background(), `SELECT next_offset FROM scd2sink_offsets WHERE topic = $1 AND partition = 0`, topic).Scan(&got); err == nil && got == want {
			return
		}
	}
	t.Fatalf("scd2sink_offsets for %s stayed at %d, want %d", topic, got, want)
}

func keys(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var got string
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(acct_id, ' ' ORDER BY acct_id), '') FROM acct_history`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	return got
}

// span is the keys from..to-1 as keys lists them.
func span(from, to int) string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("k%03d", i))
	}
	return strings.Join(out, " ")
}

// TestLogTruncatedWhileReading: the broker's log is truncated below the
// reader's position while it runs (an unclean leader election: the next
// fetch is out of range and the log now ends at 10, below the 30 read and
// recorded). With on_offset_lost latest the reader goes on from 10: the
// recorded offset comes back down to 10 at once (a restart or another
// member must not resume at the stale 30 and skip what the log holds
// from 10 on), then follows the records read again.
func TestLogTruncatedWhileReading(t *testing.T) {
	t.Parallel()
	spec := sink.TableSpec{Target: "acct_history", Schema: "public", Keys: []string{"acct_id"},
		Columns: []sink.Column{{Name: "acct_id", Type: "text"}, {Name: "plan", Type: "text"}}}
	topic := topicOf(spec.Target)
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
	ctx := context.Background()
	kafka := newKafka(t, 1, topic)
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	produce(t, kafka.ListenAddrs(), records(0, 30))
	// When the consumer found the truncation: what a batch already in
	// flight recorded before that is not a stale offset (the fetch's
	// answer comes a moment before the consumer reads it).
	var foundAt atomic.Pointer[time.Time]
	tweak := func(c *consumer.Config) {
		c.OnOffsetLost = "latest"
		c.Logger = zaptest.NewLogger(t, zaptest.WrapOptions(zap.Hooks(func(e zapcore.Entry) error {
			if strings.HasPrefix(e.Message, "offsets lost") && foundAt.Load() == nil {
				at := e.Time
				foundAt.Store(&at)
			}
			return nil
		})))
	}
	r := startWith(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 10*time.Millisecond, tweak)
	waitOffset(t, pool, topic, 30)
	if _, err := pool.Exec(ctx, `CREATE TABLE offset_log (n bigint, at timestamptz DEFAULT clock_timestamp());
		CREATE FUNCTION log_offset() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO offset_log (n) VALUES (NEW.next_offset); RETURN NEW; END $$;
		CREATE TRIGGER log_offset AFTER INSERT OR UPDATE ON scd2sink_offsets FOR EACH ROW EXECUTE FUNCTION log_offset()`); err != nil {
		t.Fatal(err)
	}
	// The next fetch at 30 is out of range, and Kafka says the log holds
	// offsets 0 to 9.
	var truncated atomic.Bool
	var truncatedAt atomic.Pointer[time.Time] // when the fetch first saw the truncation
	kafka.ControlKey(int16(kmsg.Fetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kafka.KeepControl()
		req := kr.(*kmsg.FetchRequest)
		if truncated.Load() {
			return nil, nil, false
		}
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				if rp.FetchOffset < 30 {
					continue
				}
				now := time.Now()
				truncatedAt.Store(&now)
				truncated.Store(true)
				resp := req.ResponseKind().(*kmsg.FetchResponse)
				resp.Version = req.Version
				st := kmsg.NewFetchResponseTopic()
				st.Topic, st.TopicID = rt.Topic, rt.TopicID
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition, sp.ErrorCode, sp.HighWatermark = rp.Partition, kerr.OffsetOutOfRange.Code, 10
				st.Partitions = append(st.Partitions, sp)
				resp.Topics = append(resp.Topics, st)
				return resp, nil, true
			}
		}
		return nil, nil, false
	})
	kafka.ControlKey(int16(kmsg.ListOffsets), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kafka.KeepControl()
		req := kr.(*kmsg.ListOffsetsRequest)
		if !truncated.Load() {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		resp.Version = req.Version
		for _, rt := range req.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition, sp.Offset, sp.LeaderEpoch = rp.Partition, 10, -1
				if rp.Timestamp == -2 {
					sp.Offset = 0
				}
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	produce(t, kafka.ListenAddrs(), records(30, 35))
	waitOffset(t, pool, topic, 35)
	r.stop(t)
	if !truncated.Load() {
		t.Fatal("the injected truncation never happened")
	}
	// What was recorded before the consumer found the truncation (a batch of
	// the first 30 committing late, recording 30 again) is not a stale
	// offset: only what came after counts.
	var log []int64
	from := *truncatedAt.Load()
	if f := foundAt.Load(); f != nil {
		from = *f
	}
	rows, err := pool.Query(ctx, `SELECT n FROM offset_log WHERE at >= $1 ORDER BY at`, from)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		log = append(log, n)
	}
	t.Logf("scd2sink_offsets went through %v", log)
	// Nothing was in flight when the truncation was found: the first offset
	// recorded after it must be 10. A stale 30 recorded first is what a
	// crash at that moment would resume from, skipping 10..29.
	if len(log) == 0 || log[0] != 10 {
		t.Errorf("scd2sink_offsets went through %v: not down to 10, where the truncated log ends, before anything else", log)
	}
	if got := keys(t, pool); got != span(0, 35) {
		t.Errorf("history holds %s", got)
	}
}
