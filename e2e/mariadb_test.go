//go:build e2e

package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// mdbSpec is how scd2sink is configured for inv.accounts.
var (
	mdbSpec = sink.TableSpec{Target: "accounts_history", Schema: "public", Keys: []string{"id"},
		TrackHistory: []string{"plan", "qty", "price", "dur"}}
	mdbCols = []string{"plan", "qty", "price", "dur", "note"}
)

// mdbWorkload changes inv.accounts as applications do, one transaction at
// a time: inserts and re-inserts, tracked and untracked updates, multi-row
// updates (rows 0, 1, 2 … of one rows event), deletes, primary-key
// changes; TIME values negative and beyond 24 hours.
type mdbWorkload struct {
	rng  *rand.Rand
	live map[int]bool
	gone []int
	next int
}

func newMDBWorkload(seed uint64) *mdbWorkload {
	return &mdbWorkload{rng: rand.New(rand.NewPCG(seed, 3)), live: map[int]bool{}, next: 1}
}

// anyLive picks a live id, the same for the same seed.
func (w *mdbWorkload) anyLive() int {
	if len(w.live) == 0 {
		return 0
	}
	ids := make([]int, 0, len(w.live))
	for id := range w.live {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids[w.rng.IntN(len(ids))]
}

func (w *mdbWorkload) dur() any {
	switch w.rng.IntN(6) {
	case 0:
		return nil
	case 1:
		return "-838:59:59"
	case 2:
		return "838:59:59"
	case 3:
		return fmt.Sprintf("-%02d:%02d:%02d.%06d", w.rng.IntN(30), w.rng.IntN(60), w.rng.IntN(60), w.rng.IntN(1000000))
	}
	return fmt.Sprintf("%d:%02d:%02d.%d", w.rng.IntN(200), w.rng.IntN(60), w.rng.IntN(60), w.rng.IntN(10))
}

func (w *mdbWorkload) insert(ctx context.Context, tx *sql.Tx, id int) error {
	w.live[id] = true
	_, err := tx.ExecContext(ctx, `INSERT INTO inv.accounts (id, plan, qty, price, dur, note) VALUES (?, ?, ?, ?, ?, ?)`,
		id, scdtest.Pick(w.rng, "basic", "pro", "team"), w.rng.IntN(9), fmt.Sprintf("%d.%02d", w.rng.IntN(500), w.rng.IntN(100)), w.dur(), "new")
	return err
}

// statement runs one random statement in tx.
func (w *mdbWorkload) statement(ctx context.Context, tx *sql.Tx) error {
	id := w.anyLive()
	p := w.rng.IntN(100)
	switch {
	case id == 0 || p < 25:
		if len(w.gone) > 0 && w.rng.IntN(3) == 0 {
			id, w.gone = w.gone[0], w.gone[1:]
		} else {
			id, w.next = w.next, w.next+1
		}
		return w.insert(ctx, tx, id)
	case p < 55:
		_, err := tx.ExecContext(ctx, `UPDATE inv.accounts SET plan = ?, qty = ?, dur = ? WHERE id = ?`,
			scdtest.Pick(w.rng, "basic", "pro", "team", "enterprise"), w.rng.IntN(9), w.dur(), id)
		return err
	case p < 65:
		_, err := tx.ExecContext(ctx, `UPDATE inv.accounts SET note = ? WHERE id = ?`, fmt.Sprintf("note %d", w.rng.IntN(1000)), id)
		return err
	case p < 75:
		ids := []any{id, w.anyLive(), w.anyLive()}
		_, err := tx.ExecContext(ctx, `UPDATE inv.accounts SET qty = coalesce(qty, 0) + 1, price = price + 1 WHERE id IN (?, ?, ?)`, ids...)
		return err
	case p < 92:
		delete(w.live, id)
		w.gone = append(w.gone, id)
		_, err := tx.ExecContext(ctx, `DELETE FROM inv.accounts WHERE id = ?`, id)
		return err
	default: // a primary-key change: Debezium's delete and create
		to := w.next
		w.next++
		delete(w.live, id)
		w.live[to] = true
		w.gone = append(w.gone, id)
		_, err := tx.ExecContext(ctx, `UPDATE inv.accounts SET id = ? WHERE id = ?`, to, id)
		return err
	}
}

// run runs n transactions of one to four statements on db, calling at(i)
// before transaction i.
func (w *mdbWorkload) run(ctx context.Context, db *sql.DB, n int, at func(i int)) error {
	for i := 0; i < n; i++ {
		if at != nil {
			at(i)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		for s := 1 + w.rng.IntN(4); s > 0; s-- {
			if err := w.statement(ctx, tx); err != nil {
				tx.Rollback()
				return fmt.Errorf("transaction %d: %w", i, err)
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		if w.rng.IntN(4) == 0 {
			time.Sleep(time.Duration(w.rng.IntN(400)) * time.Millisecond) // some changes a second apart, most not
		}
	}
	return nil
}

// mariadbTruth folds the audit logs (the primary's, then the promoted
// replica's) with the reference model: events in commit order, the
// statement's second as valid time, a primary-key change as a delete of
// the old key and a create of the new.
func mariadbTruth(audit []auditRow) []string {
	var evs []*change.Event
	seq := int64(0)
	add := func(o change.Op, r auditRow, key string) {
		seq++
		ev := &change.Event{Table: mdbSpec.Target, Key: []any{key}, Seq: change.MustSeq(seq), Op: o, ValidFrom: time.Unix(r.ts, 0).UTC()}
		if o.HasAfter() {
			ev.After = map[string]any{"id": key}
			for i, c := range mdbCols {
				if v := r.vals[i]; v == nil {
					ev.After[c] = nil
				} else if c == "dur" {
					ev.After[c] = intervalText(*v)
				} else {
					ev.After[c] = *v
				}
			}
		}
		evs = append(evs, ev)
	}
	for _, r := range audit {
		if id := r.newID; id == nil || !isWorkload(*id) {
			if id := r.oldID; id == nil || !isWorkload(*id) {
				continue // a seed row's
			}
		}
		switch r.op {
		case "I":
			add(change.OpCreate, r, *r.newID)
		case "U":
			if *r.oldID != *r.newID {
				add(change.OpDelete, r, *r.oldID)
				add(change.OpCreate, r, *r.newID)
			} else {
				add(change.OpUpdate, r, *r.newID)
			}
		case "D":
			add(change.OpDelete, r, *r.oldID)
		}
	}
	return stripSeq(scdtest.ModelLines(mdbSpec, mdbCols, scdtest.Fold(mdbSpec, mdbCols, evs)))
}

// The snapshot's rows: keys from seedID on, which the workload never
// touches.
const (
	seedID   = 900000
	seedRows = 20
)

func isWorkload(id string) bool {
	n, err := strconv.Atoi(id)
	return err == nil && n < seedID
}

// workloadLines keeps the history lines of the workload's keys.
func workloadLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		if key, _, _ := strings.Cut(l, " "); isWorkload(key) {
			out = append(out, l)
		}
	}
	return out
}

// mariadbConnector is the MariaDB connector's configuration, capturing
// inv.accounts from the server on port.
func mariadbConnector(dir string, port int) string {
	return fmt.Sprintf(`name=inv-source
connector.class=io.debezium.connector.mariadb.MariaDbConnector
tasks.max=1
database.hostname=127.0.0.1
database.port=%d
database.user=dbz
database.password=dbz
database.server.id=5401
topic.prefix=inv
database.include.list=inv
table.include.list=inv.accounts
include.schema.changes=false
schema.history.internal=io.debezium.storage.file.history.FileSchemaHistory
schema.history.internal.file.filename=%s
snapshot.mode=initial
bigint.unsigned.handling.mode=precise
provide.transaction.metadata=%t
`, port, filepath.Join(dir, "schema-history.dat"), os.Getenv("E2E_MDB_TXMETA") != "")
}

const mariadbDebezium = "Debezium 3.5.0.Final (mariadb connector)"

// sinkMetric reads one sample from the /metrics of scd2sink process name
// (its address from the config runSinkTables wrote); -1 when absent.
func sinkMetric(t *testing.T, dir, name, sample string) float64 {
	t.Helper()
	cfg, err := os.ReadFile(filepath.Join(dir, name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`addr: "([^"]+)"`).FindSubmatch(cfg)
	if m == nil {
		t.Fatal("no http addr in the config")
	}
	resp, err := http.Get("http://" + string(m[1]) + "/metrics")
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
	return -1
}

// TestMariaDBFailover: a MariaDB primary with a GTID replica, Debezium's
// MariaDB connector, scd2sink with connector: mariadb. The workload runs on
// the primary while its binlog is rotated to .000006, scd2sink is
// SIGKILLed and Connect is SIGKILLed (it sends again what followed its
// last flushed offset: duplicates, not late events). Then the primary
// stops, the replica (binlog still at .000001) is promoted, Connect is
// pointed at it with the same offsets, and the workload goes on there —
// deletes and re-inserts of keys across the failover included. The history
// equals the fold of both servers' audit logs; no event was dead-lettered
// or taken for one that disagrees with its time; verify passes.
func TestMariaDBFailover(t *testing.T) {
	skipOnCompose(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeLog4j(t, cache)
	primary := startMariaDB(t, ctx, dir, 1)
	replica := startMariaDB(t, ctx, dir, 2)
	primary.exec(t, ctx, auditSchemaMariaDB)
	replica.exec(t, ctx, auditSchemaMariaDB)
	primary.exec(t, ctx, invSchema)
	replica.exec(t, ctx, fmt.Sprintf(`CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%d, MASTER_USER='dbz', MASTER_PASSWORD='dbz',
		MASTER_USE_GTID=slave_pos; START SLAVE`, primary.port))
	// What the snapshot reads (the audit log holds their inserts, but not
	// the snapshot's time: they are checked on their own).
	for i := 0; i < seedRows; i++ {
		primary.exec(t, ctx, fmt.Sprintf(`INSERT INTO inv.accounts VALUES (%d, 'seed', %d, 1.50, '-100:00:00.25', 'seeded')`, seedID+i, i))
	}
	w := newMDBWorkload(1)

	target := startTarget(t, ctx)
	kafka := startBroker(t, cache, dir)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.addr()))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 2, 1, nil, "inv.inv.accounts")
	cl.Close()
	if err != nil || resp.Err != nil {
		t.Fatalf("creating the topic: %v %v", err, resp.Err)
	}
	conn := startConnector(t, cache, dir, kafka.addr(), mariadbConnector(dir, primary.port), "", mariadbDebezium)
	// E2E_MDB_CONNECTOR=mysql runs it with MySQL's [file, pos, row] (to see
	// the history go wrong at the failover).
	// E2E_MDB_TXMETA=1 turns Debezium's transaction metadata on and orders
	// by [source.gtid, transaction.total_order] (docs/sources.md).
	tablesYAML := `defaults:
  connector: ` + envOr("E2E_MDB_CONNECTOR", "mariadb") + `
tables:
  - topic: inv.inv.accounts
    target: accounts_history
    track_history: [plan, qty, price, dur]
`
	if os.Getenv("E2E_MDB_TXMETA") != "" {
		tablesYAML += "    sequence_by: [source.gtid, transaction.total_order]\n"
	}
	sinkProc := runSinkTables(t, dir, "scd2sink", kafka.addr(), target.dsn, tablesYAML)
	// The workload starts once the snapshot is in the history: changes
	// before a snapshot completes are history Debezium never sends.
	var seeds int
	if err := waitFor(ctx, 90*time.Second, func() (bool, error) {
		err := target.pool.QueryRow(ctx, `SELECT count(*) FROM accounts_history WHERE id >= $1 AND is_current AND plan = 'seed'
			AND dur = '-100:00:00.25'::interval AND price = 1.50`, seedID).Scan(&seeds)
		return seeds == seedRows, err
	}); err != nil {
		t.Fatalf("the snapshot's %d rows never reached the history (%d did): %v\n%s\n%s", seedRows, seeds, err, sinkProc.tail(20), conn.proc.tail(20))
	}
	converge := func(what string, audit []auditRow) {
		t.Helper()
		want := mariadbTruth(audit)
		var got []string
		if err := waitFor(ctx, 120*time.Second, func() (bool, error) {
			got = workloadLines(stripSeq(scdtest.HistoryLines(t, target.pool, mdbSpec, mdbCols)))
			return scdtest.DiffLines(want, got) == "", nil
		}); err != nil {
			if keep := os.Getenv("E2E_KEEP"); keep != "" {
				_ = exec.Command("cp", "-r", dir, keep).Run()
			}
			t.Fatalf("%s: the history never matched the audit log (%d versions expected, %d got): %v\n%s\n%s\n%s", what, len(want), len(got), err,
				scdtest.DiffLines(want, got), sinkProc.tail(20), conn.proc.tail(20))
		}
		t.Logf("%s: history equals the audit log, %d versions", what, len(want))
	}

	// On the primary: binlog rotations, scd2sink and Connect SIGKILLed.
	err = w.run(ctx, primary.db, 90, func(i int) {
		switch {
		case i%15 == 14:
			primary.exec(t, ctx, "FLUSH BINARY LOGS")
		case i == 25:
			sinkProc.kill()
			sinkProc = runSinkTables(t, dir, "scd2sink", kafka.addr(), target.dsn, tablesYAML)
		case i == 50:
			conn.proc.kill()
			conn.start(t, dir, cache)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 30*time.Second, func() (bool, error) {
		p, err := primary.gtidPos(ctx, "gtid_binlog_pos")
		if err != nil {
			return false, err
		}
		r, err := replica.gtidPos(ctx, "gtid_slave_pos")
		return p == r && err == nil, err
	}); err != nil {
		t.Fatalf("the replica never caught up: %v", err)
	}
	audit := primary.readAudit(t, ctx)
	converge("before the failover", audit)
	t.Logf("before the failover: %v duplicates dropped (Connect's replay), primary at %s, replica at %s",
		sinkMetric(t, dir, "scd2sink", "scd2sink_duplicates_dropped_total"), primary.binlogFile(t, ctx), replica.binlogFile(t, ctx))

	// The failover: the primary stops, the replica is promoted, Connect
	// follows it with the same offsets.
	primary.proc.stop(30 * time.Second)
	conn.proc.stop(30 * time.Second)
	replica.exec(t, ctx, "STOP SLAVE; RESET SLAVE ALL")
	if err := os.WriteFile(conn.connector, []byte(mariadbConnector(dir, replica.port)), 0o644); err != nil {
		t.Fatal(err)
	}
	streaming := conn.count("Keepalive thread is running")
	conn.start(t, dir, cache)
	// Debezium 3.5.0 resumes on the new primary only while its GTID
	// position still holds the old primary's last GTID ("0-1-N"): once the
	// new primary took a write ("0-2-M") it refuses to start ("no longer
	// available on the server"; 3.6.1 goes on, REAL_STACK.md). So it
	// streams before the workload moves on.
	if err := waitFor(ctx, 60*time.Second, func() (bool, error) {
		if conn.count("Task threw an uncaught") > 0 {
			return false, fmt.Errorf("the connector failed:\n%s", conn.proc.tail(30))
		}
		return conn.count("Keepalive thread is running") > streaming, nil
	}); err != nil {
		t.Fatalf("Debezium never streamed from the new primary: %v", err)
	}
	err = w.run(ctx, replica.db, 90, func(i int) {
		switch i {
		case 40:
			replica.exec(t, ctx, "FLUSH BINARY LOGS")
		case 60:
			sinkProc.kill()
			sinkProc = runSinkTables(t, dir, "scd2sink", kafka.addr(), target.dsn, tablesYAML)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	audit = append(audit, replica.readAudit(t, ctx)...)
	converge("after the failover", audit)
	if n := sinkMetric(t, dir, "scd2sink", `scd2sink_sequence_disagreements_total{target="accounts_history"}`); n > 0 {
		t.Errorf("%v events taken for late ones that disagree with their time", n)
	}
	sinkProc.stop(30 * time.Second)
	for _, bad := range []string{"dead-lettered", "sequence puts it before"} {
		if b, _ := os.ReadFile(sinkProc.log); strings.Contains(string(b), bad) {
			t.Errorf("scd2sink logged %q:\n%s", bad, sinkProc.tail(30))
		}
	}
	if out, err := exec.Command(binary, "verify", "--config", filepath.Join(dir, "scd2sink.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("scd2sink verify: %v\n%s", err, out)
	}
}

// targetDB is a target PostgreSQL for one test.
type targetDB struct {
	dsn  string
	pool *pgxpool.Pool
}

func startTarget(t *testing.T, ctx context.Context) targetDB {
	t.Helper()
	c, err := pgtest.StartLocal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	dsn, err := c.CreateDatabase(ctx, "warehouse")
	if err != nil {
		t.Fatal(err)
	}
	return targetDB{dsn: dsn, pool: utcPool(t, dsn)}
}

// count counts the lines of Connect's log (all its runs) holding s.
func (c *connect) count(s string) int {
	b, _ := os.ReadFile(c.proc.log)
	return strings.Count(string(b), s)
}
