package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestQuietSnapshotIsDecided: a full snapshot recorded by another member
// (here a Sink of its own) is reconciled by the running member once that
// member has applied its topic past the snapshot, although the member that
// recorded it stays quiet and the running member had already looked for
// snapshots before it was recorded: nobody else would look again.
func TestQuietSnapshotIsDecided(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	spec := sink.TableSpec{Target: "customers_history", Schema: "public", Keys: []string{"id"}, TrackHistory: []string{"plan"},
		Type1Scope: sink.AllVersions, Deletes: sink.DeletesClose, SnapshotDeletes: true}
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "plan", Schema: `{"type":"string","optional":true}`}}}
	topic := topicOf(spec.Target)
	kafka := newKafka(t, 1, topic)
	at := func(h int) time.Time { return time.Date(2026, 5, 1, h, 0, 0, 0, time.UTC) }
	rec := func(c scdtest.Change) *kgo.Record {
		k, v := src.Envelope(c)
		return &kgo.Record{Topic: topic, Key: k, Value: v}
	}
	var creates []*kgo.Record
	for id := 1; id <= 4; id++ {
		creates = append(creates, rec(scdtest.Change{Op: "c", After: scdtest.Row{"id": id, "plan": "basic"}, LSN: int64(100 + id), TxID: 1, Commit: at(1)}))
	}
	produce(t, kafka.ListenAddrs(), creates)
	r := start(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 20*time.Millisecond)
	defer r.stop(t)
	waitApplied(t, pool, "public", map[string]int64{topic: 4})
	// Another member recorded a snapshot at LSN 500 that read keys 1 and 2,
	// its records below offset 5 (one record more than applied yet).
	other, err := sink.New(sink.Config{Schema: "public", Tables: []sink.TableSpec{spec}, ConsumerGroup: "g"}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Init(ctx); err != nil {
		t.Fatal(err)
	}
	read := func(id int, end bool) *change.Event {
		return &change.Event{Table: spec.Target, Key: []any{int64(id)}, Seq: change.MustSeq(500), Op: change.OpRead, ValidFrom: at(5),
			After: map[string]any{"id": int64(id), "plan": "basic"}, SnapshotEnd: end}
	}
	p0 := change.Partition{Topic: topic}
	if _, err := other.Apply(ctx, sink.Batch{Events: []*change.Event{read(1, false), read(2, true)}, Lock: []change.Partition{p0},
		Snapshots: []sink.Snapshot{{Target: spec.Target, Seq: change.MustSeq(500), At: at(5), Topic: topic, Until: map[int32]int64{0: 5}}}}); err != nil {
		t.Fatal(err)
	}
	// The running member applies the topic past it; then all is quiet.
	produce(t, kafka.ListenAddrs(), []*kgo.Record{rec(scdtest.Change{Op: "c", After: scdtest.Row{"id": 9, "plan": "basic"}, LSN: 600, TxID: 2, Commit: at(6)})})
	waitApplied(t, pool, "public", map[string]int64{topic: 5})
	applied := time.Now()
	for {
		var done bool
		_ = pool.QueryRow(ctx, `SELECT done_at IS NOT NULL FROM scd2sink_snapshots`).Scan(&done)
		if done {
			break
		}
		if time.Since(applied) > 5*time.Second {
			t.Fatal("the snapshot was not reconciled within 5 s of its topic being applied past it")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("reconciled %s after the topic was applied past it", time.Since(applied).Round(time.Millisecond))
	var closed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM customers_history WHERE valid_to = $1`, at(5)).Scan(&closed); err != nil || closed != 2 {
		t.Fatalf("%d versions closed at the snapshot (%v), want 2 (keys 3 and 4)", closed, err)
	}
}
