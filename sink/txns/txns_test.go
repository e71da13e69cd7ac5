package txns

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// newReads is a fresh database with the service's tables, and its store
// of group g's reads.
func newReads(t *testing.T) (*pgxpool.Pool, *Reads) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := catalog.EnsureService(context.Background(), pool, catalog.Service{Schema: "public", DeadLetterTable: "dead",
		ReorderWindow: time.Second, Logger: zap.NewNop()}); err != nil {
		t.Fatal(err)
	}
	return pool, NewReads(pool, "public", "g")
}

func apply(t *testing.T, pool *pgxpool.Pool, marks ...Mark) {
	t.Helper()
	if err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return Applied(context.Background(), tx, "public", "g", marks)
	}); err != nil {
		t.Fatal(err)
	}
}

func horizon(t *testing.T, pool *pgxpool.Pool, topic string) *time.Time {
	t.Helper()
	var h *time.Time
	err := pool.QueryRow(context.Background(), `SELECT horizon FROM scd2sink_transaction_horizon WHERE consumer_group = 'g' AND topic = $1`, topic).Scan(&h)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	return h
}

// TestHorizon: what the horizon is as ENDs are recorded and their events
// applied — the last END read, or just before the earliest transaction
// missing events; ENDs recorded again (a second member) are skipped; a
// redelivered event counts once; a topic's partition with no END yet, or
// an END that could not be decoded, holds it; transaction ids of two
// topics never meet; complete transactions are pruned and one that waited
// too long is given up.
func TestHorizon(t *testing.T) {
	ctx := context.Background()
	pool, reads := newReads(t)
	reads.ReadWait = 0
	const topic = "shop.transaction"
	t0 := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	if err := reads.Begin(ctx, topic, false); err != nil {
		t.Fatal(err)
	}
	if err := reads.Started(ctx, topic, map[int32]int64{0: 0, 1: 0}); err != nil {
		t.Fatal(err)
	}
	end := func(p int32, off int64, id string, i int, counts map[string]int64) End {
		aw := map[string]bool{}
		for c := range counts {
			aw[c] = true
		}
		return End{Partition: p, Offset: off, ID: id, Commit: at(i), Counts: counts, Awaited: aw}
	}
	x := end(0, 0, "1", 1, map[string]int64{"public.a": 2, "public.b": 1})
	y := end(0, 1, "2", 2, map[string]int64{"public.a": 1})
	if err := reads.Record(ctx, topic, []End{x, y}, map[int32]int64{0: 2}); err != nil {
		t.Fatal(err)
	}
	if h := horizon(t, pool, topic); h != nil {
		t.Fatalf("horizon %s while partition 1 has no END", h)
	}
	if err := reads.Record(ctx, topic, []End{end(1, 0, "3", 3, map[string]int64{"public.b": 1})}, map[int32]int64{1: 1}); err != nil {
		t.Fatal(err)
	}
	want := at(1).Add(-time.Microsecond)
	if h := horizon(t, pool, topic); h == nil || !h.Equal(want) {
		t.Fatalf("horizon %v, want just before the incomplete transaction 1 (%s)", h, want)
	}
	// Recorded again, as a second member would: skipped.
	if err := reads.Record(ctx, topic, []End{x, y}, map[int32]int64{0: 2}); err != nil {
		t.Fatal(err)
	}
	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_transactions`).Scan(&rows)
	if rows != 4 {
		t.Fatalf("%d transaction rows, want 4", rows)
	}
	// Transaction 1's events, one of them twice, and one of another
	// topic's transaction of the same id: still incomplete.
	apply(t, pool, Mark{Topic: topic, ID: "1", Collection: "public.a", Order: 1, At: at(1)},
		Mark{Topic: topic, ID: "1", Collection: "public.a", Order: 1, At: at(1)},
		Mark{Topic: "other.transaction", ID: "1", Collection: "public.a", Order: 2, At: at(1)},
		Mark{Topic: topic, ID: "1", Collection: "public.b", Order: 3, At: at(1)})
	if h := horizon(t, pool, topic); h == nil || !h.Equal(want) {
		t.Fatalf("horizon %v, want %s: a duplicate or another topic's mark counted", h, want)
	}
	apply(t, pool, Mark{Topic: topic, ID: "1", Collection: "public.a", Order: 2, At: at(1)})
	want = at(2).Add(-time.Microsecond)
	if h := horizon(t, pool, topic); h == nil || !h.Equal(want) {
		t.Fatalf("horizon %v, want just before transaction 2 (%s)", h, want)
	}
	apply(t, pool, Mark{Topic: topic, ID: "2", Collection: "public.a", Order: 1, At: at(2)},
		Mark{Topic: topic, ID: "3", Collection: "public.b", Order: 1, At: at(3)})
	if h := horizon(t, pool, topic); h == nil || !h.Equal(at(2)) {
		t.Fatalf("horizon %v, want the earlier partition's last END (%s)", h, at(2))
	}
	if _, err := reads.Maintain(ctx, topic, true); err != nil {
		t.Fatal(err)
	}
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_transactions`).Scan(&rows)
	var marks int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_transaction_events WHERE topic = $1`, topic).Scan(&marks)
	if rows != 0 || marks != 0 {
		t.Fatalf("%d transaction rows and %d marks left once complete", rows, marks)
	}
	// An undecodable record after transaction 2 holds the horizon at the
	// last END read, moving nothing on; given up, it holds it no more.
	hold := End{Partition: 0, Offset: 2, ID: "undecodable 0/2", Commit: at(2), Counts: map[string]int64{"": 1},
		Awaited: map[string]bool{"": true}, Hold: true}
	if err := reads.Record(ctx, topic, []End{hold, end(0, 3, "4", 9, map[string]int64{"public.a": 1})}, map[int32]int64{0: 4}); err != nil {
		t.Fatal(err)
	}
	apply(t, pool, Mark{Topic: topic, ID: "4", Collection: "public.a", Order: 1, At: at(9)})
	want = at(2).Add(-time.Microsecond)
	if h := horizon(t, pool, topic); h == nil || !h.Equal(want) {
		t.Fatalf("horizon %v, want %s: held by the undecodable record", h, want)
	}
	given, err := reads.Maintain(ctx, topic, false)
	if err != nil || len(given) != 0 {
		t.Fatalf("given up %v (%v) before its tables were applied past it", given, err)
	}
	// Every partition of the topic's tables applied ten minutes past it.
	if _, err := pool.Exec(ctx, `INSERT INTO scd2sink_progress (consumer_group, topic, partition, target, caught_up_at, transaction_topic)
		VALUES ('g', 'shop.public.a', 0, 'a_history', $1, $2)`, at(2).Add(GiveUpAfter+time.Second), topic); err != nil {
		t.Fatal(err)
	}
	if given, err = reads.Maintain(ctx, topic, false); err != nil || len(given) != 1 || given[0].ID != "undecodable 0/2" {
		t.Fatalf("given up %+v (%v), want the undecodable record", given, err)
	}
	if _, err := reads.Maintain(ctx, topic, false); err != nil {
		t.Fatal(err)
	}
	if h := horizon(t, pool, topic); h == nil || !h.Equal(at(3)) {
		t.Fatalf("horizon %v once given up, want the last END of partition 1 (%s)", h, at(3))
	}
}
