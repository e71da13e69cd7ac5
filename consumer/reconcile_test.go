package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSnapshotReconciliationEndToEnd: Debezium envelopes over three
// partitions, a full snapshot that does not read three keys, the consumer
// stopped in the middle of it, a change after it, and a second snapshot
// that reads a closed key again: the keys each snapshot did not read are
// closed at its time, once.
func TestSnapshotReconciliationEndToEnd(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	spec := sink.TableSpec{Target: "customers_history", Schema: "public", Keys: []string{"id"}, TrackHistory: []string{"plan"},
		Type1Scope: sink.AllVersions, Deletes: sink.DeletesClose, SnapshotDeletes: true}
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "plan", Schema: `{"type":"string","optional":true}`}}}
	topic := topicOf(spec.Target)
	kafka := newKafka(t, 3, topic)
	at := func(h int) time.Time { return time.Date(2026, 5, 1, h, 0, 0, 0, time.UTC) }
	rec := func(c scdtest.Change) *kgo.Record {
		k, v := src.Envelope(c)
		return &kgo.Record{Topic: topic, Key: k, Value: v}
	}
	row := func(id int, plan string) scdtest.Row { return scdtest.Row{"id": id, "plan": plan} }
	var first, second []*kgo.Record
	for id := 1; id <= 6; id++ {
		first = append(first, rec(scdtest.Change{Op: "c", After: row(id, "basic"), LSN: int64(100 + id), TxID: 1, Commit: at(1)}))
	}
	// Snapshot 1 at LSN 500 reads 1, 2 and 3: the consumer stops after 2.
	first = append(first, rec(scdtest.Change{Op: "r", After: row(1, "basic"), LSN: 500, Commit: at(2), Snapshot: "first"}),
		rec(scdtest.Change{Op: "r", After: row(2, "basic"), LSN: 500, Commit: at(2), Snapshot: "true"}))
	second = append(second, rec(scdtest.Change{Op: "r", After: row(3, "basic"), LSN: 500, Commit: at(2), Snapshot: "last"}),
		rec(scdtest.Change{Op: "u", After: row(4, "pro"), LSN: 600, Commit: at(3)}),
		// Snapshot 2 at LSN 900 reads 1, 4 and 5 (closed by snapshot 1).
		rec(scdtest.Change{Op: "r", After: row(1, "basic"), LSN: 900, Commit: at(4), Snapshot: "first"}),
		rec(scdtest.Change{Op: "r", After: row(4, "pro"), LSN: 900, Commit: at(4), Snapshot: "true"}),
		rec(scdtest.Change{Op: "r", After: row(5, "basic"), LSN: 900, Commit: at(4), Snapshot: "last"}))
	produce(t, kafka.ListenAddrs(), first)
	r := start(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 50*time.Millisecond)
	waitApplied(t, pool, "public", map[string]int64{topic: int64(len(first))})
	r.stop(t)
	if got := historyOf(t, pool); strings.Contains(got, "current=false") {
		t.Fatalf("closed before the snapshot completed:\n%s", got)
	}
	produce(t, kafka.ListenAddrs(), second)
	r = start(t, kafka.ListenAddrs(), pool, "public", []sink.TableSpec{spec}, 50*time.Millisecond)
	waitApplied(t, pool, "public", map[string]int64{topic: int64(len(first) + len(second))})
	deadline := time.Now().Add(30 * time.Second)
	for {
		var done int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM scd2sink_snapshots WHERE done_at IS NOT NULL`).Scan(&done)
		if done == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 snapshots reconciled", done)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.stop(t)
	want := strings.Join([]string{
		"1 basic 01 - true",
		"2 basic 01 04 false",
		"3 basic 01 04 false",
		"4 basic 01 02 false",
		"4 pro 03 - true",
		"5 basic 01 02 false",
		"5 basic 04 - true",
		"6 basic 01 02 false",
	}, "\n")
	if got := historyOf(t, pool); got != want {
		t.Fatalf("history:\n%s\nwant:\n%s", got, want)
	}
}

// historyOf renders customers_history as "id plan from-hour to-hour current".
func historyOf(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id::text || ' ' || plan || ' ' || to_char(valid_from AT TIME ZONE 'UTC', 'HH24') || ' ' ||
		coalesce(to_char(valid_to AT TIME ZONE 'UTC', 'HH24'), '-') || ' ' || is_current::text FROM customers_history ORDER BY id, valid_from`)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}
