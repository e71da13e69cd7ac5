package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPartitionsAdded: partitions added to a topic while two members
// consume it are noticed at the assignment that follows and recorded as a
// resize (so that its writers take turns, sink/resize.go); keys whose
// changes move to another partition keep an exact history.
func TestPartitionsAdded(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	spec := sink.TableSpec{Target: "customers_history", Schema: "public", Keys: []string{"id"}, TrackHistory: []string{"plan"},
		Type1Scope: sink.AllVersions, Deletes: sink.DeletesClose}
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "plan", Schema: `{"type":"string","optional":true}`}}}
	topic := topicOf(spec.Target)
	kafka := newKafka(t, 2, topic)
	at := func(s int) time.Time { return time.Date(2026, 7, 1, 0, 0, s, 0, time.UTC) }
	type change struct {
		id   int
		plan string
		s    int
	}
	var sent []change
	step := 0
	wave := func() {
		t.Helper()
		var recs []*kgo.Record
		for id := 0; id < 40; id++ {
			step++
			c := change{id, fmt.Sprintf("p%d", step), step}
			op := "u"
			if len(sent) < 40 {
				op = "c"
			}
			k, v := src.Envelope(scdtest.Change{Op: op, After: scdtest.Row{"id": id, "plan": c.plan}, LSN: int64(1000 + step), TxID: int64(step), Commit: at(step)})
			recs = append(recs, &kgo.Record{Topic: topic, Key: k, Value: v})
			sent = append(sent, c)
		}
		produce(t, kafka.ListenAddrs(), recs)
	}
	tweak := func(c *consumer.Config) { c.MetadataMaxAge = time.Second; c.SessionTimeout = 6 * time.Second }
	r1 := startWith(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 20*time.Millisecond, tweak)
	r2 := startWith(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 20*time.Millisecond, tweak)
	wave()
	waitApplied(t, pool, "public", map[string]int64{topic: 40})
	var parts int
	if err := pool.QueryRow(ctx, `SELECT partitions FROM scd2sink_topics WHERE topic = $1`, topic).Scan(&parts); err != nil || parts != 2 {
		t.Fatalf("recorded %d partitions (%v), want 2", parts, err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreatePartitions(ctx, 2, topic); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var resized bool
		_ = pool.QueryRow(ctx, `SELECT resized_at IS NOT NULL AND partitions = 4 FROM scd2sink_topics WHERE topic = $1`, topic).Scan(&resized)
		if resized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the added partitions were not recorded as a resize within 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		wave()
	}
	waitApplied(t, pool, "public", map[string]int64{topic: int64(len(sent))})
	r1.stop(t)
	r2.stop(t)
	byKey := map[int][]change{}
	for _, c := range sent {
		byKey[c.id] = append(byKey[c.id], c)
	}
	var want []string
	for id := 0; id < 40; id++ {
		vs := byKey[id]
		for j, v := range vs {
			to := "-"
			if j+1 < len(vs) {
				to = at(vs[j+1].s).Format("150405")
			}
			want = append(want, fmt.Sprintf("%d %s %s %s", id, v.plan, at(v.s).Format("150405"), to))
		}
	}
	rows, err := pool.Query(ctx, `SELECT id || ' ' || plan || ' ' || to_char(valid_from AT TIME ZONE 'UTC', 'HH24MISS') || ' ' ||
		coalesce(to_char(valid_to AT TIME ZONE 'UTC', 'HH24MISS'), '-') FROM customers_history ORDER BY id, valid_from`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	rows.Close()
	if d := scdtest.DiffLines(want, got); d != "" {
		t.Fatalf("history differs from the changes:\n%s", d)
	}
}
