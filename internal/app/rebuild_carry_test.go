package app

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRebuildKeepsWhatKafkaLost: run builds the history of every event;
// then Kafka loses part of them — retention moves every partition's log
// start to its middle (DeleteRecords), or compaction keeps only each
// key's latest record — and rebuild replays what is left. Every version
// whose events are gone is carried over from the live table: the rebuilt
// history equals the fold of every event, and every version keeps its
// scd_id. The records left come in shuffled order, so the replay folds
// late events, deletes and re-creates on top of carried versions. With
// --from-scratch the rebuilt history is the fold of what Kafka holds.
func TestRebuildKeepsWhatKafkaLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		lose    string // "log start" or "compaction"
		scratch bool
	}{
		{"log start moved", "log start", false},
		{"compacted", "compaction", false},
		{"log start moved, from scratch", "log start", true},
	} {
		t.Run(tc.name, func(t *testing.T) { testRebuildCarry(t, tc.lose, tc.scratch) })
	}
}

func testRebuildCarry(t *testing.T, lose string, scratch bool) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(48, uint64(len(lose))))
	sc := scdtest.BigScenario(rng, "public", 20)
	topic := map[string]string{"acct_history": "src.acct", "item_history": "src.item"}
	specs := map[string]sink.TableSpec{}
	for _, s := range sc.Specs {
		specs[s.Target] = s
	}
	type sent struct {
		rec *kgo.Record
		ev  *change.Event
	}
	var all []sent
	for _, ev := range sc.Events {
		k, v := scdtest.Debezium(ev, specs[ev.Table].Keys)
		all = append(all, sent{&kgo.Record{Topic: topic[ev.Table], Key: k, Value: v}, ev})
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	newKafka := func(list []sent) *kfake.Cluster {
		t.Helper()
		kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "src.acct", "src.item"), kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(kafka.Close)
		cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		var recs []*kgo.Record
		for _, s := range list {
			recs = append(recs, s.rec)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		return kafka
	}
	kafka := newKafka(all)
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	a, i := specs["acct_history"], specs["item_history"]
	cfgFor := func(kafka *kfake.Cluster) *config.Config {
		t.Helper()
		brokers, _ := json.Marshal(kafka.ListenAddrs())
		cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, group_id: live, session_timeout: 2s}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 20ms}
sink: {batch_max_events: 300, batch_max_wait: 10ms}
tables:
  - {topic: src.acct, target: acct_history, keys: [acct_id], track_history: [plan, city], type1_scope: %s, deletes: %s}
  - {topic: src.item, target: item_history, keys: [shop, sku], type1_scope: %s, deletes: %s}
`, brokers, dsn, a.Type1Scope, a.Deletes, i.Type1Scope, i.Deletes)), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	cfg := cfgFor(kafka)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg, Options{}) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int64
		_ = pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE consumer_group = 'live'").Scan(&n)
		if n >= int64(len(all)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("run did not apply everything")
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var evs []*change.Event
	for _, s := range all {
		evs = append(evs, s.ev)
	}
	ids := map[string]map[string]int64{}
	for _, spec := range sc.Specs {
		cols := sc.Cols[spec.Target]
		got := scdtest.HistoryLines(t, pool, spec, cols)
		if d := scdtest.DiffLines(scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, evs)), got); d != "" {
			t.Fatalf("%s after run differs from the fold:\n%s", spec.Target, d)
		}
		ids[spec.Target] = versionIDs(t, pool, spec)
	}

	// Kafka loses events.
	var kept []*change.Event
	switch lose {
	case "log start":
		adm := kadm.NewClient(mustClient(t, kafka))
		ends, err := adm.ListEndOffsets(ctx, "src.acct", "src.item")
		if err != nil {
			t.Fatal(err)
		}
		mid := kadm.Offsets{}
		ends.Each(func(o kadm.ListedOffset) {
			mid.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset / 2, LeaderEpoch: -1})
		})
		resp, err := adm.DeleteRecords(ctx, mid)
		if err != nil || resp.Error() != nil {
			t.Fatalf("deleting records: %v %v", err, resp.Error())
		}
		for _, s := range all {
			if m, _ := mid.Lookup(s.rec.Topic, s.rec.Partition); s.rec.Offset >= m.At {
				kept = append(kept, s.ev)
			}
		}
	case "compaction":
		latest := map[string]sent{}
		var order []string
		for _, s := range all {
			if s.rec.Key == nil {
				continue // a truncate: compaction takes no record without a key
			}
			k := s.rec.Topic + "/" + string(s.rec.Key)
			if _, ok := latest[k]; !ok {
				order = append(order, k)
			}
			if p, ok := latest[k]; !ok || s.rec.Offset > p.rec.Offset {
				latest[k] = sent{&kgo.Record{Topic: s.rec.Topic, Key: s.rec.Key, Value: s.rec.Value}, s.ev}
			}
		}
		var list []sent
		for _, k := range order {
			list = append(list, latest[k])
			kept = append(kept, latest[k].ev)
		}
		cfg = cfgFor(newKafka(list))
	}
	if len(kept) == 0 || len(kept) == len(all) {
		t.Fatalf("Kafka kept %d of %d events", len(kept), len(all))
	}
	var opts Options
	if lose == "log start" && !scratch {
		// The carry's first three tries fail as a missing privilege
		// would (42501, a trigger on the rebuilt table): rebuild waits
		// and tries again, it does not exit.
		var once sync.Once
		opts.beforeCarry = func() {
			once.Do(func() {
				if _, err := pool.Exec(ctx, `CREATE SEQUENCE carry_fails;
					CREATE FUNCTION carry_fail() RETURNS trigger LANGUAGE plpgsql AS $$
					BEGIN IF nextval('carry_fails') <= 3 THEN RAISE EXCEPTION 'injected' USING ERRCODE = '42501'; END IF; RETURN NEW; END $$;
					CREATE TRIGGER carry_fail BEFORE INSERT ON acct_history__rebuild FOR EACH ROW EXECUTE FUNCTION carry_fail()`); err != nil {
					t.Error(err)
				}
			})
		}
	}
	if err := Rebuild(ctx, cfg, opts, RebuildMode{FromScratch: scratch}); err != nil {
		t.Fatal(err)
	}
	if opts.beforeCarry != nil {
		var tries int64
		if err := pool.QueryRow(ctx, "SELECT last_value FROM carry_fails").Scan(&tries); err != nil || tries <= 3 {
			t.Errorf("the injected failure fired %d times (%v): the carry was not tried again", tries, err)
		}
	}
	want := evs
	if scratch {
		want = kept
	}
	for _, spec := range sc.Specs {
		cols := sc.Cols[spec.Target]
		got := scdtest.HistoryLines(t, pool, spec, cols)
		if d := scdtest.DiffLines(scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, want)), got); d != "" {
			t.Errorf("%s rebuilt (%d of %d events in Kafka) differs from the fold:\n%s", spec.Target, len(kept), len(all), d)
			scdtest.LogDiffKeys(t, pool, spec, d)
		}
		if scratch {
			continue
		}
		after, moved := versionIDs(t, pool, spec), 0
		for k, id := range ids[spec.Target] {
			if after[k] != id {
				moved++
			}
		}
		if moved > 0 || len(after) != len(ids[spec.Target]) {
			t.Errorf("%s: %d of %d versions have another scd_id after the rebuild (%d versions now)", spec.Target, moved, len(ids[spec.Target]), len(after))
		}
	}
	var report strings.Builder
	if n, err := Verify(ctx, cfg, &report); err != nil || n != 0 {
		t.Errorf("verify after the rebuild: %d violations (%v)\n%s", n, err, report.String())
	}
	t.Logf("%d of %d events left in Kafka", len(kept), len(all))
}

// versionIDs maps each version of spec's table, by its key and opening
// sequence, to its scd_id.
func versionIDs(t *testing.T, pool *pgxpool.Pool, spec sink.TableSpec) map[string]int64 {
	t.Helper()
	cols := make([]string, len(spec.Keys))
	for i, k := range spec.Keys {
		cols[i] = k + "::text"
	}
	rows, err := pool.Query(context.Background(), fmt.Sprintf(`SELECT concat_ws('|', %s, encode(scd_seq, 'hex')), scd_id FROM %s`, strings.Join(cols, ", "), spec.Target))
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

func mustClient(t *testing.T, kafka *kfake.Cluster) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
