package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestEraseThenRebuild: keys erased while run runs (one single-column,
// one composite) lose every version, side row, repair audit and dead
// letter; their later events, a dead letter of a record never decoded,
// and a rebuild from the whole topic do not bring them back; the other
// keys keep the fold's history and verify passes.
func TestEraseThenRebuild(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(31, 7))
	sc := scdtest.BigScenario(rng, "public", 12)
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
	// The erased keys: the first key of each table.
	erased := map[string][]any{}
	for _, ev := range sc.Events {
		if ev.Key != nil && erased[ev.Table] == nil {
			erased[ev.Table] = ev.Key
		}
	}
	isErased := func(ev *change.Event) bool {
		return ev.Key != nil && fmt.Sprint(ev.Key) == fmt.Sprint(erased[ev.Table])
	}
	var recs []*kgo.Record
	var kept []*change.Event
	for _, ev := range sc.Events {
		k, v := scdtest.Debezium(ev, specs[ev.Table].Keys)
		recs = append(recs, &kgo.Record{Topic: topic[ev.Table], Key: k, Value: v})
		if !isErased(ev) {
			kept = append(kept, ev)
		}
	}
	rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	first, second := recs[:len(recs)*6/10:len(recs)*6/10], recs[len(recs)*6/10:]
	// A record of the erased acct key that cannot be decoded: a dead
	// letter before the erase, and one the rebuild meets again.
	acctKey, _ := scdtest.Debezium(&change.Event{Table: "acct_history", Key: erased["acct_history"], Op: change.OpDelete, Seq: change.MustSeq(1)}, specs["acct_history"].Keys)
	first = append(first, &kgo.Record{Topic: "src.acct", Key: acctKey, Value: []byte("not json")})

	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(rs []*kgo.Record) {
		t.Helper()
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	keyFile := filepath.Join(t.TempDir(), "erasure.key")
	if err := os.WriteFile(keyFile, []byte("a secret of thirty-two bytes....\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	a, i := specs["acct_history"], specs["item_history"]
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, group_id: live, session_timeout: 2s}
postgres: {dsn: %q}
http: {addr: ""}
erasure_key_file: %q
sequencer: {reorder_window: 20ms}
sink: {batch_max_events: 200, batch_max_wait: 10ms}
tables:
  - {topic: src.acct, target: acct_history, keys: [acct_id], track_history: [plan, city], type1_scope: %s, deletes: %s}
  - {topic: src.item, target: item_history, keys: [shop, sku], type1_scope: %s, deletes: %s}
`, brokers, dsn, keyFile, a.Type1Scope, a.Deletes, i.Type1Scope, i.Deletes)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	applied := func(group string, n int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			var got int64
			_ = pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE consumer_group = $1", group).Scan(&got)
			if got >= int64(n) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("group %s did not apply %d records", group, n)
	}
	where := map[string]string{}
	for target, key := range erased {
		var conds []string
		for j, k := range specs[target].Keys {
			conds = append(conds, fmt.Sprintf("%s::text = '%v'", k, key[j]))
		}
		where[target] = strings.Join(conds, " AND ")
	}
	traces := func(what string) int {
		t.Helper()
		total := 0
		for target, w := range where {
			for _, rel := range []string{target, target + "_scd_events"} {
				var n int
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+rel+" WHERE "+w).Scan(&n); err != nil {
					t.Fatal(err)
				}
				total += n
			}
		}
		for _, dl := range []string{"scd2sink_dead_letters", "scd2sink_dead_letters__rebuild"} {
			var n int
			err := pool.QueryRow(ctx, "SELECT count(*) FROM "+dl+" WHERE position($1 in key) > 0", acctKey).Scan(&n)
			if err == nil {
				total += n
			} else if !strings.Contains(err.Error(), "does not exist") {
				t.Fatal(err)
			}
		}
		return total
	}

	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg, Options{}) }()
	produce(first)
	applied("live", len(first))
	if n := traces("before"); n == 0 {
		t.Fatal("the erased keys left no trace before the erase: the test exercises nothing")
	}
	for target, key := range erased {
		vals := make([]string, len(key))
		for j, v := range key {
			vals[j] = fmt.Sprint(v)
		}
		var out bytes.Buffer
		if err := Erase(ctx, cfg, Options{}, EraseRequest{Table: target, Keys: [][]string{vals}, Reason: "test"}, &out); err != nil {
			t.Fatal(err)
		}
		if target == "acct_history" && strings.Contains(out.String(), vals[0]) {
			t.Errorf("erase printed the key: %s", out.String())
		}
		t.Log(strings.TrimSpace(out.String()))
	}
	if n := traces("after erase"); n != 0 {
		t.Fatalf("%d traces of the erased keys after erase", n)
	}
	produce(second)
	applied("live", len(first)+len(second))
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := traces("after run"); n != 0 {
		t.Fatalf("%d traces of the erased keys after their later events", n)
	}
	if err := Rebuild(ctx, cfg, Options{}, RebuildMode{}); err != nil {
		t.Fatal(err)
	}
	if n := traces("after rebuild"); n != 0 {
		t.Fatalf("%d traces of the erased keys after a rebuild", n)
	}
	for _, spec := range sc.Specs {
		cols := sc.Cols[spec.Target]
		if d := scdtest.DiffLines(scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, kept)), scdtest.HistoryLines(t, pool, spec, cols)); d != "" {
			t.Errorf("%s differs from the fold without the erased keys:\n%s", spec.Target, d)
		}
	}
	var out bytes.Buffer
	if n, err := Verify(ctx, cfg, &out); err != nil || n != 0 {
		t.Fatalf("verify: %d violations (%v):\n%s", n, err, out.String())
	}
}
