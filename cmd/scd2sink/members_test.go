package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestThreeMembersOneHistory is the many-writers property test: random
// histories of two tables (late events, duplicates, re-creates, equal
// and backwards times, placeholders) arrive in random order while three
// `run` instances share the group and everything that writes history
// outside the batch path happens at once:
//   - members join and leave: a third joins while the first records
//     stream, one leaves (SIGTERM) and comes back, one is SIGKILLed and
//     restarted;
//   - both topics get two more partitions while events stream, so that
//     keys move to other partitions;
//   - acct_history's plan column was created narrow by hand (varchar(8)):
//     changes to a longer plan are dead-lettered; the operator widens the
//     column and runs `dead-letters replay --all` while events stream;
//   - a full snapshot reads a fifth of the accounts: the guard holds its
//     reconciliation (it would close most live keys), and `reconcile
//     --confirm` applies it while events stream.
//
// Every history must end equal to the fold of all events (the snapshot's
// deletes included), every offset committed, and `verify` clean.
// MEMBERS_SEED picks another history.
func TestThreeMembersOneHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seed := uint64(3)
	if s := os.Getenv("MEMBERS_SEED"); s != "" {
		n, _ := strconv.Atoi(s)
		seed = uint64(n)
	}
	rng := rand.New(rand.NewPCG(seed, 9))
	sc := scdtest.BigScenario(rng, "public", 60)
	sc.Specs[0].SnapshotDeletes = true
	acct, item := sc.Specs[0], sc.Specs[1]
	long := 0
	for _, ev := range sc.Events {
		if ev.Table == acct.Target && ev.After != nil && ev.After["plan"] == "pro" && rng.IntN(3) == 0 {
			ev.After["plan"] = "enterprise" // 10 characters: does not fit varchar(8)
			long++
		}
	}
	// The snapshot: after every change of acct in sequence, reading a
	// fifth of its keys (live or not) with a row of its own.
	var maxSeq change.Seq
	keys := map[string][]any{}
	for _, ev := range sc.Events {
		if ev.Table == acct.Target {
			if maxSeq == nil || ev.Seq.Compare(maxSeq) > 0 {
				maxSeq = ev.Seq
			}
			if ev.Key != nil {
				keys[fmt.Sprint(ev.Key...)] = ev.Key
			}
		}
	}
	snapSeq := change.MustSeq(1 << 30)
	if snapSeq.Compare(maxSeq) <= 0 {
		t.Fatalf("the scenario's sequences reach %v", maxSeq)
	}
	snapAt := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	var reads []*change.Event
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for k := range keys {
			if !yield(k) {
				return
			}
		}
	}) {
		if rng.IntN(5) != 0 {
			continue
		}
		reads = append(reads, &change.Event{Table: acct.Target, Key: keys[id], Seq: snapSeq, Op: change.OpRead, ValidFrom: snapAt,
			After: map[string]any{"acct_id": keys[id][0], "plan": "pro", "city": "Wien", "name": "Snap", "score": json.Number("1")}})
	}
	reads[len(reads)-1].SnapshotEnd = true
	sc.Events = append(sc.Events, reads...)

	topicOf := map[string]string{acct.Target: "src.acct", item.Target: "src.item"}
	specOf := map[string]sink.TableSpec{acct.Target: acct, item.Target: item}
	var recs []*kgo.Record
	for _, ev := range sc.Events[:len(sc.Events)-len(reads)] {
		recs = append(recs, debeziumRecord(ev, specOf[ev.Table], topicOf[ev.Table]))
	}
	rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	var snapRecs []*kgo.Record
	for _, ev := range reads {
		snapRecs = append(snapRecs, debeziumRecord(ev, acct, "src.acct"))
	}

	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "src.acct", "src.item"), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE acct_history (acct_id text, plan varchar(8), city text, name text, score bigint)`); err != nil {
		t.Fatal(err)
	}
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfgFile := filepath.Join(t.TempDir(), "scd2sink.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf(`kafka:
  brokers: %s
  group_id: members
  session_timeout: 2s
  metadata_max_age: 1s
postgres:
  dsn: %q
  schema: public
sequencer:
  reorder_window: 50ms
sink:
  batch_max_events: 200
  batch_max_wait: 20ms
http:
  addr: ""
log:
  level: warn
  format: console
shutdown_timeout: 20s
tables:
  - topic: src.acct
    target: acct_history
    keys: [acct_id]
    track_history: [plan, city]
    type1_scope: %s
    deletes: %s
    snapshot_deletes: close
  - topic: src.item
    target: item_history
    keys: [shop, sku]
    type1_scope: %s
    deletes: %s
`, brokers, dsn, acct.Type1Scope, acct.Deletes, item.Type1Scope, item.Deletes)), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &crashRig{kafka: kafka, pool: pool, cfgFile: cfgFile, sc: sc, total: int64(len(recs) + len(snapRecs)), group: "members"}
	t.Logf("seed %d: %d records (%d of them a snapshot reading %d of %d accounts), %d changes to a plan too long for the column",
		seed, r.total, len(snapRecs), len(reads), len(keys), long)

	type member struct {
		name string
		cmd  *exec.Cmd
		log  *bytes.Buffer
	}
	members := map[string]*member{}
	startMember := func(name string) {
		cmd, log := r.startNamed(t, name)
		members[name] = &member{name, cmd, log}
	}
	stopMember := func(name string, sig syscall.Signal) {
		m := members[name]
		_ = m.cmd.Process.Signal(sig)
		err := m.cmd.Wait()
		if sig == syscall.SIGTERM && err != nil {
			t.Fatalf("%s after SIGTERM: %v\n%s", name, err, m.log)
		}
		delete(members, name)
	}
	// stream produces recs in chunks of 25, 80 ms apart, with a client of
	// its own (it sees the topics' partitions as they are now).
	stream := func(recs []*kgo.Record) chan struct{} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer cl.Close()
			for i := 0; i < len(recs); i += 25 {
				if err := cl.ProduceSync(ctx, recs[i:min(i+25, len(recs))]...).FirstErr(); err != nil {
					t.Errorf("producing: %v", err)
					return
				}
				time.Sleep(80 * time.Millisecond)
			}
		}()
		return done
	}
	command := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(binary(t), append(args, "--config", cfgFile)...).CombinedOutput()
		if err != nil {
			t.Fatalf("scd2sink %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	a, b := len(recs)*2/5, len(recs)*7/10

	// Phase 1: two members, a third joins.
	startMember("m1")
	startMember("m2")
	done := stream(recs[:a])
	time.Sleep(1500 * time.Millisecond)
	startMember("m3")
	<-done
	t.Logf("phase 1: %d records, three members; %d applied", a, r.applied())

	// Phase 2: two partitions more on each topic while records stream; a
	// member leaves and comes back, another is killed and restarted.
	adm := kadm.NewClient(func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}())
	if _, err := adm.CreatePartitions(ctx, 2, "src.acct", "src.item"); err != nil {
		t.Fatal(err)
	}
	done = stream(recs[a:b])
	time.Sleep(time.Second)
	stopMember("m1", syscall.SIGTERM)
	time.Sleep(time.Second)
	stopMember("m2", syscall.SIGKILL)
	startMember("m1")
	time.Sleep(2500 * time.Millisecond) // past m2's session
	startMember("m2")
	<-done
	t.Logf("phase 2: partitions added, members left, crashed and came back; %d of %d records applied", r.applied(), b)

	// Phase 3: the snapshot, then the rest while the operator widens the
	// column, replays the dead letters and confirms the reconciliation.
	done = stream(snapRecs[:len(snapRecs)-1])
	<-done
	done = stream(append(snapRecs[len(snapRecs)-1:], recs[b:]...))
	waitFor(t, pool, `SELECT count(*) > 0 FROM scd2sink_dead_letters`, 30*time.Second)
	if _, err := pool.Exec(ctx, `DO $$ DECLARE d text := pg_get_viewdef('acct_history_current'); dc text := pg_get_viewdef('acct_history_consistent');
		c text := obj_description('acct_history_current'::regclass);
		BEGIN
			DROP VIEW acct_history_current, acct_history_consistent;
			ALTER TABLE acct_history ALTER COLUMN plan TYPE text;
			EXECUTE 'CREATE VIEW acct_history_current AS ' || d;
			EXECUTE 'CREATE VIEW acct_history_consistent AS ' || dc;
			EXECUTE format('COMMENT ON VIEW acct_history_current IS %L', c);
		END $$`); err != nil {
		t.Fatal(err)
	}
	t.Logf("replay while records stream: %s", strings.TrimSpace(command("dead-letters", "replay", "--all")))
	waitFor(t, pool, `SELECT count(*) = 1 FROM scd2sink_snapshots WHERE held_at IS NOT NULL`, 60*time.Second)
	t.Logf("reconcile --confirm while records stream: %s", strings.TrimSpace(command("reconcile", "--table", "acct_history", "--confirm")))
	<-done

	deadline := time.Now().Add(90 * time.Second)
	for r.applied() < r.total && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if r.applied() < r.total {
		for _, m := range members {
			t.Logf("%s:\n%s", m.name, m.log)
		}
		t.Fatalf("applied %d of %d records", r.applied(), r.total)
	}
	// Dead letters written while the first replay ran are replayed now.
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_dead_letters WHERE replayed_at IS NULL`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left > 0 {
		t.Logf("%d dead letters came after the first replay: %s", left, strings.TrimSpace(command("dead-letters", "replay", "--all")))
	}
	waitFor(t, pool, `SELECT count(*) = 1 FROM scd2sink_snapshots WHERE done_at IS NOT NULL`, 30*time.Second)
	// Late events noted for the snapshot are reconciled by an idle member
	// (at most every 10 s per member).
	waitFor(t, pool, `SELECT count(*) = 0 FROM scd2sink_snapshots_late`, 60*time.Second)
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range members {
			if !yield(n) {
				return
			}
		}
	}) {
		stopMember(name, syscall.SIGTERM)
	}
	var dead, replayed int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(replayed_at) FROM scd2sink_dead_letters`).Scan(&dead, &replayed); err != nil {
		t.Fatal(err)
	}
	if dead == 0 || replayed != dead {
		t.Errorf("%d dead letters, %d replayed: want some, all replayed", dead, replayed)
	}
	t.Logf("%d dead letters, all replayed", dead)
	r.check(t)
	command("verify")
}
