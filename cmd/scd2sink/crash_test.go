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
	"strconv"
	"sync"
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

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// binary builds scd2sink once per test run.
func binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "scd2sink-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "scd2sink")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func debeziumRecord(ev *change.Event, spec sink.TableSpec, topic string) *kgo.Record {
	key, value := scdtest.Debezium(ev, spec.Keys)
	return &kgo.Record{Topic: topic, Key: key, Value: value}
}

type crashRig struct {
	kafka   *kfake.Cluster
	pool    *pgxpool.Pool
	cfgFile string
	sc      scdtest.Scenario
	total   int64
	recs    []*kgo.Record
	group   string // the consumer group ("" is crash)
}

func newCrashRig(t *testing.T, seed uint64, scenarios int, partitions int32) *crashRig {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 5))
	sc := scdtest.BigScenario(rng, "public", scenarios)
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "src.acct", "src.item"),
		kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	specs := map[string]sink.TableSpec{}
	for _, s := range sc.Specs {
		specs[s.Target] = s
	}
	var recs []*kgo.Record
	for _, ev := range sc.Events {
		topic := map[string]string{"acct_history": "src.acct", "item_history": "src.item"}[ev.Table]
		recs = append(recs, debeziumRecord(ev, specs[ev.Table], topic))
	}
	rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	a, i := specs["acct_history"], specs["item_history"]
	cfg := fmt.Sprintf(`kafka:
  brokers: %s
  group_id: crash
  session_timeout: 2s
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
  - topic: src.item
    target: item_history
    keys: [shop, sku]
    type1_scope: %s
    deletes: %s
`, brokers, dsn, a.Type1Scope, a.Deletes, i.Type1Scope, i.Deletes)
	f := filepath.Join(t.TempDir(), "scd2sink.yaml")
	if err := os.WriteFile(f, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return &crashRig{kafka: kafka, pool: pool, cfgFile: f, sc: sc, total: int64(len(recs)), recs: recs}
}

// produce writes the records in chunks of n, pausing between chunks, and
// closes done when all are written.
func (r *crashRig) produce(t *testing.T, n int, pause time.Duration) (done chan struct{}) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	done = make(chan struct{})
	go func() {
		defer close(done)
		defer cl.Close()
		for i := 0; i < len(r.recs); i += n {
			if err := cl.ProduceSync(context.Background(), r.recs[i:min(i+n, len(r.recs))]...).FirstErr(); err != nil {
				t.Errorf("producing: %v", err)
				return
			}
			time.Sleep(pause)
		}
	}()
	return done
}

func (r *crashRig) start(t *testing.T) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(binary(t), "run", "--config", r.cfgFile)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &stderr
}

// applied is the number of records below the offsets recorded in PostgreSQL.
func (r *crashRig) applied() int64 {
	var n int64
	_ = r.pool.QueryRow(context.Background(), `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets`).Scan(&n)
	return n
}

func (r *crashRig) check(t *testing.T) {
	t.Helper()
	for _, spec := range r.sc.Specs {
		cols := r.sc.Cols[spec.Target]
		want := scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, r.sc.Events))
		got := scdtest.HistoryLines(t, r.pool, spec, cols)
		if d := scdtest.DiffLines(want, got); d != "" {
			t.Errorf("%s differs from the fold:\n%s", spec.Target, d)
			scdtest.LogDiffKeys(t, r.pool, spec, d)
		}
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(r.kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ka := kadm.NewClient(adm)
	ends, err := ka.ListEndOffsets(context.Background(), "src.acct", "src.item")
	if err != nil {
		t.Fatal(err)
	}
	group := r.group
	if group == "" {
		group = "crash"
	}
	committed, err := ka.FetchOffsets(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		c, ok := committed.Lookup(o.Topic, o.Partition)
		if !ok || c.At != o.Offset {
			t.Errorf("%s/%d: committed %d, end %d", o.Topic, o.Partition, c.At, o.Offset)
		}
	})
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestCrashRecovery SIGKILLs the real binary at random moments while it
// consumes, restarts it, and finally stops it with SIGTERM: the history
// must equal the fold and every offset must be committed.
func TestCrashRecovery(t *testing.T) {
	t0 := time.Now()
	seed := uint64(1)
	if s := os.Getenv("CRASH_SEED"); s != "" {
		n, _ := strconv.Atoi(s)
		seed = uint64(n)
	}
	r := newCrashRig(t, seed, 120, 3)
	t.Logf("rig ready after %s", time.Since(t0))
	rng := rand.New(rand.NewPCG(2, 3))
	produced := r.produce(t, 100, 400*time.Millisecond)
	kills := 0
	for kills < 5 || !closed(produced) {
		cmd, _ := r.start(t)
		// Past the 2s session of the member killed before, so that this
		// one joins and is killed while it consumes.
		time.Sleep(time.Duration(2500+rng.IntN(1500)) * time.Millisecond)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		kills++
		t.Logf("kill %d: %d of %d records applied", kills, r.applied(), r.total)
	}
	cmd, stderr := r.start(t)
	time.Sleep(500 * time.Millisecond) // let it install its signal handler
	deadline := time.Now().Add(90 * time.Second)
	for r.applied() < r.total && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, stderr.String())
	}
	t.Logf("%d kills, %d records, stopped after %s", kills, r.total, time.Since(t0))
	var dead int
	var deadErr string
	_ = r.pool.QueryRow(context.Background(), "SELECT count(*), coalesce(max(error), '') FROM scd2sink_dead_letters").Scan(&dead, &deadErr)
	if dead > 0 {
		t.Errorf("%d dead letters, e.g. %s", dead, deadErr)
	}
	if r.applied() < r.total {
		t.Fatalf("applied %d of %d records", r.applied(), r.total)
	}
	r.check(t)
	t.Logf("checked after %s", time.Since(t0))
}
