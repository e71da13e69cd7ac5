package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// eraseTypeCase is a table keyed by columns of one kind of type: the key
// erased (K) and a key kept (L), as Debezium's JSON writes them and as
// `erase --key` names them.
type eraseTypeCase struct {
	name  string
	cols  []scdtest.Col // the key columns
	k, l  scdtest.Row   // their values in Debezium's JSON encoding
	kText []string      // K as erase's --key takes it
}

// TestEraseEveryKeyType: keys of every kind of type — a composite of an
// integer and a timestamp, timestamptz, date, time, bytea, numeric, uuid,
// text, and a composite of uuid, date and numeric — each with three dead
// letters (a conflict, a record never decoded keyed with the key's schema,
// and one keyed without a schema: epoch numbers, base64), and a
// primary-key change's header naming it in another key's dead letter;
// the database's default isolation is REPEATABLE READ. Erase removes
// every version and dead letter of each key, and the header, and says
// so; a record of an erased key that cannot be decoded, produced after
// the erase, is dropped and counted, never stored; verify passes.
func TestEraseEveryKeyType(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	micro := `{"type":"int64","optional":false,"name":"io.debezium.time.MicroTimestamp","version":1}`
	zoned := `{"type":"string","optional":false,"name":"io.debezium.time.ZonedTimestamp","version":1}`
	date := `{"type":"int32","optional":false,"name":"io.debezium.time.Date","version":1}`
	mtime := `{"type":"int64","optional":false,"name":"io.debezium.time.MicroTime","version":1}`
	bytesS := `{"type":"bytes","optional":false}`
	dec := `{"type":"bytes","optional":false,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}}`
	uuid := `{"type":"string","optional":false,"name":"io.debezium.data.Uuid","version":1}`
	text := `{"type":"string","optional":false}`
	cases := []eraseTypeCase{
		{name: "orders", cols: []scdtest.Col{{Name: "order_id", Schema: `{"type":"int32","optional":false}`}, {Name: "created_at", Schema: micro}},
			k: scdtest.Row{"order_id": 7, "created_at": at.UnixMicro()}, l: scdtest.Row{"order_id": 7, "created_at": at.Add(time.Second).UnixMicro()},
			kText: []string{"7", "2024-01-01 00:00:00"}},
		{name: "tz", cols: []scdtest.Col{{Name: "k", Schema: zoned}},
			k: scdtest.Row{"k": "2024-01-01T00:00:00Z"}, l: scdtest.Row{"k": "2024-01-02T00:00:00Z"}, kText: []string{"2024-01-01 00:00:00+00"}},
		{name: "day", cols: []scdtest.Col{{Name: "k", Schema: date}},
			k: scdtest.Row{"k": scdtest.Days(at)}, l: scdtest.Row{"k": scdtest.Days(at) + 1}, kText: []string{"2024-01-01"}},
		{name: "clock", cols: []scdtest.Col{{Name: "k", Schema: mtime}},
			k: scdtest.Row{"k": int64(45296789000)}, l: scdtest.Row{"k": int64(45297000000)}, kText: []string{"12:34:56.789"}},
		{name: "blob", cols: []scdtest.Col{{Name: "k", Schema: bytesS}},
			k: scdtest.Row{"k": "AQL/"}, l: scdtest.Row{"k": "AQM="}, kText: []string{`\x0102ff`}},
		{name: "amount", cols: []scdtest.Col{{Name: "k", Schema: dec}},
			k: scdtest.Row{"k": scdtest.DecimalB64("1250")}, l: scdtest.Row{"k": scdtest.DecimalB64("1251")}, kText: []string{"12.50"}},
		{name: "ident", cols: []scdtest.Col{{Name: "k", Schema: uuid}},
			k: scdtest.Row{"k": "6f1c2d3e-0000-4000-8000-00000000000a"}, l: scdtest.Row{"k": "6f1c2d3e-0000-4000-8000-00000000000b"},
			kText: []string{"6f1c2d3e-0000-4000-8000-00000000000a"}},
		{name: "label", cols: []scdtest.Col{{Name: "k", Schema: text}},
			k: scdtest.Row{"k": "Anne Müller"}, l: scdtest.Row{"k": "Bob"}, kText: []string{"Anne Müller"}},
		{name: "mixed", cols: []scdtest.Col{{Name: "u", Schema: uuid}, {Name: "d", Schema: date}, {Name: "n", Schema: dec}},
			k:     scdtest.Row{"u": "6f1c2d3e-0000-4000-8000-00000000000a", "d": scdtest.Days(at), "n": scdtest.DecimalB64("-5")},
			l:     scdtest.Row{"u": "6f1c2d3e-0000-4000-8000-00000000000a", "d": scdtest.Days(at), "n": scdtest.DecimalB64("5")},
			kText: []string{"6f1c2d3e-0000-4000-8000-00000000000a", "2024-01-01", "-0.05"}},
	}
	srcs := map[string]*scdtest.Source{}
	var topics []string
	for _, c := range cases {
		var keys []string
		for _, col := range c.cols {
			keys = append(keys, col.Name)
		}
		src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: c.name, Keys: keys,
			Cols: append(append([]scdtest.Col(nil), c.cols...), scdtest.Col{Name: "note", Schema: `{"type":"string","optional":true}`})}
		srcs[c.name] = src
		topics = append(topics, src.Topic())
	}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topics...), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	dsn := pgtest.NewDatabase(t)
	admin, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var db string
	if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET default_transaction_isolation = 'repeatable read'"); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var iso string
	if err := pool.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil || iso != "repeatable read" {
		t.Fatalf("default isolation %q (%v)", iso, err)
	}
	keyFile := filepath.Join(t.TempDir(), "erasure.key")
	if err := os.WriteFile(keyFile, []byte("a secret of thirty-two bytes....\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	addr := freeAddr(t)
	var tables strings.Builder
	for _, c := range cases {
		fmt.Fprintf(&tables, "  - {topic: %s, target: %s_history, keys: [%s]}\n", srcs[c.name].Topic(), c.name, strings.Join(srcs[c.name].Keys, ", "))
	}
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, group_id: live, session_timeout: 2s}
postgres: {dsn: %q}
http: {addr: %q}
erasure_key_file: %q
sequencer: {reorder_window: 20ms}
sink: {batch_max_events: 200, batch_max_wait: 10ms}
tables:
%s`, brokers, dsn, addr, keyFile, tables.String())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	with := func(r scdtest.Row, note string) scdtest.Row {
		out := scdtest.Row{"note": note}
		for k, v := range r {
			out[k] = v
		}
		return out
	}
	var recs []*kgo.Record
	for _, c := range cases {
		src := srcs[c.name]
		kk, kv := src.Envelope(scdtest.Change{Op: "c", After: with(c.k, "first"), LSN: 100, Commit: at})
		_, conflict := src.Envelope(scdtest.Change{Op: "c", After: with(c.k, "other"), LSN: 100, Commit: at})
		bareKey, _ := src.Schemaless(scdtest.Change{Op: "c", After: with(c.k, "x"), LSN: 101, Commit: at})
		lk, lv := src.Envelope(scdtest.Change{Op: "c", After: with(c.l, "kept"), LSN: 110, Commit: at})
		recs = append(recs,
			&kgo.Record{Topic: src.Topic(), Key: kk, Value: kv},
			&kgo.Record{Topic: src.Topic(), Key: kk, Value: conflict},           // a conflict: decoded, rejected
			&kgo.Record{Topic: src.Topic(), Key: kk, Value: []byte("not json")}, // never decoded, keyed with its schema
			&kgo.Record{Topic: src.Topic(), Key: bareKey, Value: []byte("{")},   // never decoded, keyed without a schema
			&kgo.Record{Topic: src.Topic(), Key: lk, Value: lv},
			// Another key's record that cannot be decoded, with the
			// header of a primary-key change naming K.
			&kgo.Record{Topic: src.Topic(), Key: lk, Value: []byte("not json either"), Headers: []kgo.RecordHeader{{Key: "__debezium.oldkey", Value: kk}}},
		)
	}
	cl := mustClient(t, kafka)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg, Options{}) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitCount := func(q string, want int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		var got int64
		for time.Now().Before(deadline) {
			if err := pool.QueryRow(ctx, q).Scan(&got); err == nil && got == want {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s: %d, want %d", q, got, want)
	}
	waitCount("SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE consumer_group = 'live'", int64(len(recs)))
	waitCount("SELECT count(*) FROM scd2sink_dead_letters", int64(4*len(cases)))

	for _, c := range cases {
		target := c.name + "_history"
		var out bytes.Buffer
		if err := Erase(ctx, cfg, Options{}, EraseRequest{Table: target, Keys: [][]string{c.kText}, Reason: "test"}, &out); err != nil {
			t.Fatalf("%s: erase: %v", c.name, err)
		}
		if !strings.Contains(out.String(), "1 versions, 0 side rows, 0 repair audits, 3 dead letters") ||
			!strings.Contains(out.String(), "1 key-change headers") || strings.Contains(out.String(), "could not be read") {
			t.Errorf("%s: erase said:\n%s", c.name, out.String())
		}
		var versions, letters int64
		var hdrs string
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM %s), (SELECT count(*) FROM scd2sink_dead_letters WHERE target = $1),
			(SELECT coalesce(string_agg(coalesce(headers::text, ''), ' '), '') FROM scd2sink_dead_letters WHERE target = $1)`, target), target).Scan(&versions, &letters, &hdrs); err != nil {
			t.Fatal(err)
		}
		if versions != 1 || letters != 1 || strings.Contains(hdrs, "oldkey") {
			t.Errorf("%s after the erase: %d versions (want L's 1), %d dead letters (want L's 1), headers %s", c.name, versions, letters, hdrs)
		}
	}
	// A record of an erased key that cannot be decoded, after the erase:
	// dropped and counted, never stored.
	var late []*kgo.Record
	for _, c := range cases {
		src := srcs[c.name]
		kk, _ := src.Envelope(scdtest.Change{Op: "c", After: with(c.k, "again"), LSN: 200, Commit: at})
		late = append(late, &kgo.Record{Topic: src.Topic(), Key: kk, Value: []byte("still not json")})
	}
	if err := cl.ProduceSync(ctx, late...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitCount("SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE consumer_group = 'live'", int64(len(recs)+len(late)))
	waitCount("SELECT count(*) FROM scd2sink_dead_letters", int64(len(cases)))
	for _, c := range cases {
		if page := waitMetric(addr, fmt.Sprintf(`scd2sink_erased_events_dropped_total{target="%s_history"} 1`, c.name), 10*time.Second); page != "" {
			t.Errorf("%s: the late record of the erased key was not counted:\n%s", c.name, grepLines(page, "erased"))
		}
	}
	var report strings.Builder
	if n, err := Verify(ctx, cfg, &report); err != nil || n != 0 {
		t.Errorf("verify: %d violations (%v)\n%s", n, err, report.String())
	}
}
