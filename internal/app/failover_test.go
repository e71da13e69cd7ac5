package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// binlogRecord is one record Debezium's MariaDB connector wrote, in the
// order it wrote them; idx is the change's place in the source's commit
// order (a re-sent change keeps its idx).
type binlogRecord struct {
	key, value []byte
	part       int32
	idx        int
	tombstone  bool
}

// failoverWorkload is what Debezium writes of a MariaDB primary that
// rotated its binlog four times, then failed over to its GTID replica
// (log_slave_updates, gtid_strict_mode), whose binlog starts at .000001:
// a snapshot of 20 accounts, transactions of one to three accounts
// (creates, updates, deletes, re-creates; several per second, as
// MariaDB's whole-second times make them), the last transactions before
// the failover sent again from the replica's binlog (Debezium resumes by
// GTID from its last flushed offset), and later a connector restart that
// sends the last transactions again from the same binlog (exact
// duplicates). With txMeta the records carry Debezium's transaction block
// (provide.transaction.metadata=true), and the transactions sent again
// from the replica may create accounts too.
func failoverWorkload(src *scdtest.Source, seed uint64, txMeta bool) []binlogRecord {
	rng := rand.New(rand.NewPCG(seed, 29))
	t0 := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	alive := map[int]bool{}
	var out []binlogRecord
	idx := 0
	render := func(id int, c scdtest.Change, b scdtest.Binlog, i int) []binlogRecord {
		k, v := src.MariaDBEnvelope(c, b)
		part := int32(id % 2)
		recs := []binlogRecord{{key: k, value: v, part: part, idx: i}}
		if c.Op == "d" {
			recs = append(recs, binlogRecord{key: k, part: part, idx: i, tombstone: true})
		}
		return recs
	}
	row := func(id int) scdtest.Row {
		return scdtest.Row{"id": id, "plan": scdtest.Pick(rng, "basic", "pro", "team"), "qty": rng.IntN(5)}
	}
	for id := 1; id <= 20; id++ {
		snap := "true"
		switch id {
		case 1:
			snap = "first"
		case 20:
			snap = "last"
		}
		alive[id] = true
		idx++
		out = append(out, render(id, scdtest.Change{Op: "r", After: row(id), Commit: t0, Snapshot: snap},
			scdtest.Binlog{File: "mysql-bin.000001", Pos: 342, ServerID: 1}, idx)...)
	}
	type change1 struct {
		id  int
		c   scdtest.Change
		idx int
	}
	gtid := 0
	// newTxn makes the next transaction: one to three accounts, each
	// created when absent, else updated or (one in four) deleted.
	newTxn := func(onlyLive bool) (int, []change1) {
		gtid++
		at := t0.Add(time.Duration(gtid) * 700 * time.Millisecond)
		var chs []change1
		used := map[int]bool{}
		for tries, n := 0, 1+rng.IntN(3); len(chs) < n && tries < 100; tries++ {
			id := 1 + rng.IntN(30)
			if used[id] || (onlyLive && !alive[id]) {
				continue
			}
			used[id] = true
			var c scdtest.Change
			switch {
			case !alive[id]:
				c = scdtest.Change{Op: "c", After: row(id)}
				alive[id] = true
			case rng.IntN(4) == 0:
				c = scdtest.Change{Op: "d", Before: row(id)}
				alive[id] = false
			default:
				c = scdtest.Change{Op: "u", Before: row(id), After: row(id)}
			}
			c.Commit = at
			idx++
			chs = append(chs, change1{id, c, idx})
		}
		return gtid, chs
	}
	// A server's binlog: its file number and position.
	type binlog struct {
		file int
		pos  int64
	}
	// write renders a transaction as read from bl's binlog; origin is the
	// server that committed it first (its GTID's server id).
	write := func(bl *binlog, g int, chs []change1, origin int64) []binlogRecord {
		var recs []binlogRecord
		for i, ch := range chs {
			bl.pos += 150 + int64(rng.IntN(100))
			b := scdtest.Binlog{GTID: fmt.Sprintf("0-%d-%d", origin, g), File: fmt.Sprintf("mysql-bin.%06d", bl.file), Pos: bl.pos, ServerID: origin, Thread: 11}
			if txMeta {
				b.TxOrder = int64(i + 1)
			}
			recs = append(recs, render(ch.id, ch.c, b, ch.idx)...)
		}
		bl.pos += 60
		return recs
	}
	primary := &binlog{file: 1, pos: 342}
	replica := &binlog{file: 1, pos: 256}
	var fromReplica [][]binlogRecord // the primary's transactions in the replica's binlog
	for i := 0; i < 56; i++ {
		// The last four, which Debezium sends again after the failover,
		// change only live accounts unless the transaction block orders
		// them (docs/sources.md: a create sent again from another server's
		// binlog).
		g, chs := newTxn(i >= 52 && !txMeta)
		out = append(out, write(primary, g, chs, 1)...)
		fromReplica = append(fromReplica, write(replica, g, chs, 1))
		if i%12 == 11 {
			primary.file, primary.pos = primary.file+1, 256 // FLUSH BINARY LOGS
		}
	}
	// The failover (the primary is at .000005 now, the replica at
	// .000001): Debezium, pointed at the replica, sends again what
	// followed its last flushed offset, from the replica's binlog.
	for _, recs := range fromReplica[len(fromReplica)-4:] {
		out = append(out, recs...)
	}
	var sent [][]binlogRecord
	for i := 0; i < 44; i++ {
		g, chs := newTxn(false)
		recs := write(replica, g, chs, 2)
		out = append(out, recs...)
		sent = append(sent, recs)
		if i == 19 {
			// A connector restart on the new primary: the last three
			// transactions again, as they were (exact duplicates).
			for _, again := range sent[len(sent)-3:] {
				out = append(out, again...)
			}
		}
		if i == 29 {
			replica.file, replica.pos = replica.file+1, 256
		}
	}
	return out
}

// failoverLines is the reference fold of the workload in the source's
// commit order, rendered without sequences (the sink's are its own).
func failoverLines(t *testing.T, src *scdtest.Source, recs []binlogRecord, spec sink.TableSpec, cols []string) []string {
	t.Helper()
	dec := debezium.New([]debezium.Rule{{Topic: src.MariaDBTopic(), Target: spec.Target,
		SequenceBy: config.DefaultSequenceBy["mariadb"], ValidFrom: "source.ts_ms"}}, nil, nil)
	var evs []*change.Event
	seen := map[int]bool{}
	for _, r := range recs {
		if r.tombstone || seen[r.idx] {
			continue
		}
		seen[r.idx] = true
		ev, err := dec.Decode(context.Background(), change.Origin{Partition: change.Partition{Topic: src.MariaDBTopic()}}, r.key, r.value)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq = change.MustSeq(r.idx)
		if ev.AfterJSON != nil {
			if err := json.Unmarshal(ev.AfterJSON, &ev.After); err != nil {
				t.Fatal(err)
			}
		}
		evs = append(evs, ev)
	}
	return withoutSeq(scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, evs)))
}

var seqField = regexp.MustCompile(` seq=[0-9a-f]* `)

func withoutSeq(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = seqField.ReplaceAllString(l, " ")
	}
	return out
}

// A MariaDB failover (DESIGN.md section 3, docs/sources.md): the promoted
// replica's binlog starts at .000001, below the old primary's .000005,
// while the GTID's number in the domain goes on rising. With connector
// mariadb (source.gtid first) the history equals the reference fold in
// the source's commit order — deletes and re-creates across the failover,
// changes sent again from the replica's binlog, a connector restart's
// exact duplicates. With connector mysql's binlog positions alone the
// history is repaired into the past, as it was before GTIDs were read:
// not silently — every such late event is logged and counted in
// scd2sink_sequence_disagreements_total. Transactions sent again from the
// new primary's binlog are duplicates when the order inside a transaction
// is Debezium's transaction block ([source.gtid, transaction.total_order]);
// with positions a create among them leaves a zero-length version (the
// documented limit).
func TestMariaDBFailover(t *testing.T) {
	t.Parallel()
	src := &scdtest.Source{Server: "inv", DB: "inv", Table: "accounts", Keys: []string{"id"}, Cols: []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "plan", Schema: `{"type":"string","optional":true}`},
		{Name: "qty", Schema: `{"type":"int32","optional":true}`},
	}}
	spec := sink.TableSpec{Target: "accounts_history", Schema: "public", Keys: []string{"id"}}
	cols := []string{"plan", "qty"}
	for _, tc := range []struct {
		name, connector, sequenceBy string
		txMeta, exact               bool
	}{
		{"mariadb", "mariadb", "", false, true},
		// Transactions sent again from the new primary, creates among
		// them, are duplicates when their order inside the transaction is
		// Debezium's transaction block, not the server's binlog position.
		{"mariadb with transaction metadata", "mariadb", "[source.gtid, transaction.total_order]", true, true},
		{"mysql", "mysql", "", false, false},
		// The documented limit of positions inside a transaction: a create
		// sent again from the new primary's binlog is no duplicate, and
		// leaves a zero-length version.
		{"mariadb, a create sent again without transaction metadata", "mariadb", "", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs := failoverWorkload(src, 1, tc.txMeta)
			want := failoverLines(t, src, recs, spec, cols)
			counts := map[int32]int64{}
			for _, r := range recs {
				counts[r.part]++
			}
			seqBy := ""
			if tc.sequenceBy != "" {
				seqBy = "\n    sequence_by: " + tc.sequenceBy
			}
			kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, src.MariaDBTopic()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(kafka.Close)
			cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cl.Close)
			var krecs []*kgo.Record
			for _, r := range recs {
				krecs = append(krecs, &kgo.Record{Topic: src.MariaDBTopic(), Partition: r.part, Key: r.key, Value: r.value})
			}
			if err := cl.ProduceSync(context.Background(), krecs...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			dsn := pgtest.NewDatabase(t)
			brokers, _ := json.Marshal(kafka.ListenAddrs())
			addr := freeAddr(t)
			cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: %q}
sequencer: {reorder_window: 100ms}
sink: {batch_max_wait: 50ms, batch_max_events: 40}
defaults: {connector: %s}
tables:
  - topic: %s
    target: accounts_history%s
`, brokers, dsn, addr, tc.connector, src.MariaDBTopic(), seqBy)), func(string) (string, bool) { return "", false })
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, cfg, Options{Logger: zap.NewNop()}) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			})
			pool, err := pgxpool.New(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			deadline := time.Now().Add(30 * time.Second)
			for {
				var left int64
				err := pool.QueryRow(context.Background(), `SELECT $1::bigint + $2::bigint - coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE topic = $3`,
					counts[0], counts[1], src.MariaDBTopic()).Scan(&left)
				if err == nil && left == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not every record was applied within 30 s (%d left, %v)", left, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			got := withoutSeq(scdtest.HistoryLines(t, pool, spec, cols))
			diff := scdtest.DiffLines(want, got)
			disagreements := metricValue(t, addr, `scd2sink_sequence_disagreements_total{target="accounts_history"}`)
			if tc.exact {
				if diff != "" {
					t.Fatalf("history differs from the source's (%d versions):\n%s", len(want), diff)
				}
				if disagreements != 0 {
					t.Errorf("%v sequence disagreements counted, want none", disagreements)
				}
				return
			}
			if diff == "" {
				t.Fatal("binlog positions across the failover gave the right history: the workload does not fail over")
			}
			if tc.connector == "mariadb" {
				if !strings.Contains(diff, "extra:") || strings.Contains(diff, "missing:") {
					t.Fatalf("a create sent again: want only extra (zero-length) versions:\n%s", diff)
				}
				t.Logf("a create sent again from the new primary's binlog:\n%s", diff)
				return
			}
			if disagreements == 0 {
				t.Fatalf("the history was repaired into the past silently (no disagreement counted):\n%s", diff)
			}
			t.Logf("binlog positions alone: %v late events counted as disagreeing with their time", disagreements)
		})
	}
}

// metricValue reads one sample of /metrics (0 when absent).
func metricValue(t *testing.T, addr, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, sample+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}
