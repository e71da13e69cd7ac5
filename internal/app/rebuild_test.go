package app

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRebuild: run consumes a history; rebuild replays it into fresh
// tables and swaps them in. The rebuilt history equals run's and the fold,
// and queries running through the swap always find a table. The item
// table comes once from an exact entry, once from a topic_pattern entry
// (rebuild takes the topics it matches in Kafka).
func TestRebuild(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, item string }{
		{"exact", "topic: src.item, target: item_history"},
		{"pattern", `topic_pattern: 'src\.i[a-z]+'`},
		{"partitioned", "topic: src.item, target: item_history, partitioning: {interval: day}"},
		{"no overlap", "topic: src.item, target: item_history, history_constraint: no_overlap"},
	} {
		t.Run(tc.name, func(t *testing.T) { testRebuild(t, tc.item) })
	}
}

func testRebuild(t *testing.T, itemEntry string) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(4, 4))
	sc := scdtest.BigScenario(rng, "public", 30)
	// acct's topic holds a full snapshot that misses keys: run and the
	// replay both close them (snapshot_deletes: close).
	_, _, snap, ok := scdtest.AddSnapshot(rng, &sc)
	if !ok {
		t.Fatal("the scenario has no room for a snapshot")
	}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "src.acct", "src.item"), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()
	topic := map[string]string{"acct_history": "src.acct", "item_history": "src.item"}
	specs := map[string]sink.TableSpec{}
	for _, s := range sc.Specs {
		specs[s.Target] = s
	}
	var recs []*kgo.Record
	for _, ev := range sc.Events {
		k, v := scdtest.Debezium(ev, specs[ev.Table].Keys)
		recs = append(recs, &kgo.Record{Topic: topic[ev.Table], Key: k, Value: v})
	}
	rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	noOverlap := strings.Contains(itemEntry, "no_overlap")
	if noOverlap {
		if _, err := pool.Exec(ctx, "CREATE EXTENSION btree_gist"); err != nil {
			t.Fatal(err)
		}
	}
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	a, i := specs["acct_history"], specs["item_history"]
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, group_id: live, session_timeout: 2s}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 20ms}
sink: {batch_max_events: 300, batch_max_wait: 10ms}
tables:
  - {topic: src.acct, target: acct_history, keys: [acct_id], track_history: [plan, city], type1_scope: %s, deletes: %s, snapshot_deletes: close, snapshot_deletes_max_fraction: 1,
     views: [{name: dim_acct, grain: day, end: inclusive, current_end: "9999-12-31", columns: {scd_id: acct_key}}]}
  - {%s, keys: [shop, sku], type1_scope: %s, deletes: %s}
`, brokers, dsn, a.Type1Scope, a.Deletes, itemEntry, i.Type1Scope, i.Deletes)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	waitAll := func(group string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			var n int64
			_ = pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE consumer_group = $1", group).Scan(&n)
			if n >= int64(len(recs)) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("group %s did not apply everything", group)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg, Options{}) }()
	waitAll("live")
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var reconciled int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_snapshots WHERE consumer_group = 'live' AND done_at IS NOT NULL`).Scan(&reconciled); err != nil || reconciled != 1 {
		t.Fatalf("run reconciled %d snapshots (%v), want 1", reconciled, err)
	}
	var closedBySnapshot int // (a side row, or under deletes: new_record a version marked deleted)
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM acct_history_scd_events WHERE scd_seq = $1 AND scd_op = 'd')
		+ (SELECT count(*) FROM acct_history WHERE scd_seq = $1 AND scd_op = 'd')`, []byte(snap.Seq)).Scan(&closedBySnapshot); err != nil || closedBySnapshot == 0 {
		t.Fatalf("%d keys closed by the snapshot (%v): the scenario does not exercise reconciliation", closedBySnapshot, err)
	}
	before := map[string][]string{}
	for _, spec := range sc.Specs {
		before[spec.Target] = scdtest.HistoryLines(t, pool, spec, sc.Cols[spec.Target])
	}
	// Facts point into the history by scd_id (a dimension's surrogate
	// key): every version, by the key and the event that opened it.
	idsOf := func(target string, keys []string) map[string]int64 {
		t.Helper()
		cols := make([]string, len(keys))
		for i, k := range keys {
			cols[i] = k + "::text"
		}
		rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT concat_ws('|', %s, encode(scd_seq, 'hex')), scd_id FROM %s`, strings.Join(cols, ", "), target))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]int64{}
		for rows.Next() {
			var k string
			var id int64
			if err := rows.Scan(&k, &id); err != nil {
				t.Fatal(err)
			}
			out[k] = id
		}
		return out
	}
	facts := map[string]map[string]int64{}
	for _, spec := range sc.Specs {
		facts[spec.Target] = idsOf(spec.Target, spec.Keys)
	}

	var queries, failures atomic.Int64
	var lastErr atomic.Value
	qctx, qstop := context.WithCancel(ctx)
	qdone := make(chan struct{})
	go func() {
		defer close(qdone)
		for qctx.Err() == nil {
			var n int64
			err := pool.QueryRow(qctx, "SELECT (SELECT count(*) FROM acct_history) + (SELECT count(*) FROM item_history_current)").Scan(&n)
			if qctx.Err() != nil {
				return
			}
			queries.Add(1)
			if err != nil || n == 0 {
				failures.Add(1)
				lastErr.Store(fmt.Sprint(n, err))
			}
		}
	}()
	if err := Rebuild(ctx, cfg, Options{}, RebuildMode{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	qstop()
	<-qdone
	if failures.Load() > 0 {
		t.Fatalf("%d of %d queries during the rebuild failed, e.g. %v", failures.Load(), queries.Load(), lastErr.Load())
	}
	for _, spec := range sc.Specs {
		cols := sc.Cols[spec.Target]
		got := scdtest.HistoryLines(t, pool, spec, cols)
		if d := scdtest.DiffLines(before[spec.Target], got); d != "" {
			t.Errorf("%s rebuilt differs from run's:\n%s", spec.Target, d)
		}
		if d := scdtest.DiffLines(scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, sc.Events)), got); d != "" {
			t.Errorf("%s rebuilt differs from the fold:\n%s", spec.Target, d)
		}
	}
	// Every fact resolves to the same version: same key, same opening
	// event; the sequence goes on above every id.
	for _, spec := range sc.Specs {
		after, moved := idsOf(spec.Target, spec.Keys), 0
		for k, id := range facts[spec.Target] {
			if after[k] != id {
				moved++
			}
		}
		if moved > 0 || len(after) != len(facts[spec.Target]) {
			t.Errorf("%s: %d of %d versions have another scd_id after the rebuild (%d versions now)", spec.Target, moved, len(facts[spec.Target]), len(after))
		}
		var ahead bool
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT pg_sequence_last_value(pg_get_serial_sequence('%[1]s', 'scd_id')) >= (SELECT max(scd_id) FROM %[1]s)`, spec.Target)).Scan(&ahead); err != nil || !ahead {
			t.Errorf("%s: the scd_id sequence is behind the ids carried over (%v)", spec.Target, err)
		}
	}
	// The view reads the swapped-in table: every current version, by its key.
	var viewCur, histCur int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM dim_acct d JOIN acct_history h ON h.scd_id = d.acct_key AND h.acct_id = d.acct_id AND h.valid_from::date = d.valid_from WHERE d.is_current),
		(SELECT count(*) FROM acct_history WHERE is_current)`).Scan(&viewCur, &histCur); err != nil || viewCur != histCur || histCur == 0 {
		t.Fatalf("dim_acct after the swap: %d current rows joining acct_history, which has %d (%v)", viewCur, histCur, err)
	}
	// The as-of function serves the swapped-in table.
	for _, spec := range sc.Specs {
		var asOf, current int64
		q := fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s_as_of('infinity')), (SELECT count(*) FROM %[1]s_current)`, spec.Target)
		if err := pool.QueryRow(ctx, q).Scan(&asOf, &current); err != nil || asOf != current {
			t.Fatalf("%s_as_of after the swap: %d rows, current view %d (%v)", spec.Target, asOf, current, err)
		}
	}
	// No history table or partition keeps the rebuild's name: the next
	// rebuild creates them again (PostgreSQL names indexes apart itself).
	// A partitioned table stays one.
	var leftover string
	if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(relname, ' '), '') FROM pg_class WHERE relname LIKE '%history\_\_rebuild%' AND relkind IN ('r', 'p')`).Scan(&leftover); err != nil || leftover != "" {
		t.Errorf("relations named for the rebuild after the swap: %q (%v)", leftover, err)
	}
	if strings.Contains(itemEntry, "partitioning") {
		var parts int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'item_history_pold'::regclass`).Scan(&parts); err != nil || parts < 2 {
			t.Errorf("item_history after the swap: %d partitions of closed versions (%v)", parts, err)
		}
		// The key directory came along (verify finds it, and every key
		// without a current version in it).
		var out strings.Builder
		if n, err := Verify(ctx, cfg, &out); err != nil || n != 0 {
			t.Errorf("verify after the swap: %d violations (%v):\n%s", n, err, out.String())
		}
	}
	var liveOffsets int64
	_ = pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE consumer_group = 'live'").Scan(&liveOffsets)
	if liveOffsets != int64(len(recs)) {
		t.Fatalf("live offsets after the swap sum to %d, want %d", liveOffsets, len(recs))
	}
	t.Logf("%d records rebuilt, %d queries ran through the swap", len(recs), queries.Load())
	// The rebuilt tables serve run again.
	rctx, stop = context.WithCancel(ctx)
	go func() { done <- Run(rctx, cfg, Options{}) }()
	time.Sleep(300 * time.Millisecond)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run after the rebuild: %v", err)
	}
	if noOverlap {
		// The rebuilt table's constraint took the live name (run added
		// no second one), the replaced table kept its own under its name.
		rows, err := pool.Query(ctx, `SELECT c.relname || ':' || x.conname FROM pg_constraint x JOIN pg_class c ON c.oid = x.conrelid
			WHERE x.contype = 'x' ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(got) != 2 || got[0] != "item_history:item_history_scd_excl" || !strings.HasSuffix(got[1], "_scd_excl") ||
			!strings.HasPrefix(got[1], "item_history__replaced_") {
			t.Errorf("exclusion constraints after the swap: %v (%v)", got, err)
		}
	}
}
