package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Day two on PostgreSQL (DESIGN.md section 6): an analyst's open read, a
// column that must be added while it is open, and failures injected by
// SQLSTATE. The binary never exits, readers are never queued behind it for
// longer than lock_timeout, and the history ends equal to the fold.

// configure rewrites part of the rig's configuration file.
func (r *crashRig) configure(t *testing.T, old, new string) {
	t.Helper()
	raw, err := os.ReadFile(r.cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), old) {
		t.Fatalf("configuration has no %q", old)
	}
	if err := os.WriteFile(r.cfgFile, []byte(strings.Replace(string(raw), old, new, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// withHTTP gives the rig's service lock_timeout 1s and an HTTP endpoint,
// and returns the endpoint's base URL.
func (r *crashRig) withHTTP(t *testing.T) string {
	t.Helper()
	addr := freeAddr(t)
	r.configure(t, "  schema: public\n", "  schema: public\n  lock_timeout: 1s\n")
	r.configure(t, "http:\n  addr: \"\"\n", fmt.Sprintf("http:\n  addr: %q\n", addr))
	return "http://" + addr
}

func (r *crashRig) produceSync(t *testing.T, recs []*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
}

func (r *crashRig) waitApplied(t *testing.T, n int64, within time.Duration, cmd *exec.Cmd, stderr fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(within)
	for r.applied() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records applied after %s\n%s", r.applied(), n, within, stderr)
		}
		if cmd != nil && cmd.ProcessState != nil {
			t.Fatalf("scd2sink exited: %s\n%s", cmd.ProcessState, stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *crashRig) stop(t *testing.T, cmd *exec.Cmd, stderr fmt.Stringer) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, stderr)
	}
}

// readers runs a reporting query on table every 100 ms, each with
// statement_timeout 2s, as a third session would, until stopped; stop
// returns the failures and the slowest query.
func readers(t *testing.T, dsn string, table string) (stop func() ([]string, time.Duration)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var failures []string
	var slowest time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			start := time.Now()
			err := func() error {
				conn, err := pgx.Connect(ctx, dsn)
				if err != nil {
					return err
				}
				defer conn.Close(context.Background())
				if _, err := conn.Exec(ctx, "SET statement_timeout = '2s'"); err != nil {
					return err
				}
				var n int64
				return conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n)
			}()
			mu.Lock()
			if err != nil && ctx.Err() == nil {
				failures = append(failures, err.Error())
			}
			slowest = max(slowest, time.Since(start))
			mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() ([]string, time.Duration) {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return failures, slowest
	}
}

// metric reads one sample (name with labels, as exposed) from /metrics; 0
// when absent.
func metric(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("scraping: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

func readyz(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatalf("readyz: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestRestartWithReadOpen restarts the service while an analyst's
// transaction holds a plain read of both history tables: with nothing to
// change the restart takes no lock stronger than its DML, catches up while
// the read stays open, and a third session's reads never wait.
func TestRestartWithReadOpen(t *testing.T) {
	r := newCrashRig(t, 3, 40, 3)
	r.withHTTP(t)
	half := len(r.recs) / 2
	r.produceSync(t, r.recs[:half])
	cmd, stderr := r.start(t)
	r.waitApplied(t, int64(half), 60*time.Second, cmd, stderr)
	r.stop(t, cmd, stderr)

	ctx := context.Background()
	analyst, err := r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer analyst.Rollback(ctx) //nolint:errcheck
	var n int64
	if err := analyst.QueryRow(ctx, "SELECT (SELECT count(*) FROM acct_history) + (SELECT count(*) FROM item_history)").Scan(&n); err != nil {
		t.Fatal(err)
	}
	stopReaders := readers(t, r.pool.Config().ConnString(), "acct_history")
	r.produceSync(t, r.recs[half:])
	start := time.Now()
	cmd, stderr = r.start(t)
	r.waitApplied(t, r.total, 30*time.Second, cmd, stderr)
	t.Logf("caught up %d records in %s with the read open", r.total-int64(half), time.Since(start).Round(time.Millisecond))
	failures, slowest := stopReaders()
	if len(failures) > 0 {
		t.Errorf("%d reads failed while the service restarted, e.g. %s", len(failures), failures[0])
	}
	t.Logf("slowest read: %s", slowest.Round(time.Millisecond))
	if err := analyst.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r.stop(t, cmd, stderr)
	r.check(t)
}

// TestColumnWaitsForRead: an event brings a column the history table must
// get while an analyst's read is open. The ALTER waits at most
// lock_timeout per try (55P03, retried, /readyz not ready), other readers
// are never blocked longer than that, and the column arrives once the read
// ends.
func TestColumnWaitsForRead(t *testing.T) {
	r := newCrashRig(t, 4, 20, 1)
	base := r.withHTTP(t)
	r.produceSync(t, r.recs)
	cmd, stderr := r.start(t)
	r.waitApplied(t, r.total, 60*time.Second, cmd, stderr)

	ctx := context.Background()
	analyst, err := r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer analyst.Rollback(ctx) //nolint:errcheck
	var n int64
	if err := analyst.QueryRow(ctx, "SELECT count(*) FROM acct_history").Scan(&n); err != nil {
		t.Fatal(err)
	}
	stopReaders := readers(t, r.pool.Config().ConnString(), "acct_history")
	ev := &change.Event{Table: "acct_history", Key: []any{"NEW"}, Op: change.OpCreate, Seq: change.MustSeq(1 << 40),
		ValidFrom: time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC),
		After:     map[string]any{"acct_id": "NEW", "plan": "pro", "city": "Wien", "name": "Nia", "score": nil, "email": "nia@example.com"}}
	r.sc.Events = append(r.sc.Events, ev)
	var acct = r.sc.Specs[0]
	r.produceSync(t, []*kgo.Record{debeziumRecord(ev, acct, "src.acct")})
	r.total++

	hasEmail := func() bool {
		var ok bool
		if err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'acct_history'::regclass
			AND attname = 'email' AND NOT attisdropped)`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	deadline := time.Now().Add(15 * time.Second)
	for metric(t, base, `scd2sink_retries_total{sqlstate="55P03"}`) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no lock timeouts counted while the read is open\n%s", stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := readyz(t, base); code != http.StatusServiceUnavailable || !strings.Contains(body, "55P03") {
		t.Errorf("readyz while waiting for the lock: %d %q", code, body)
	}
	if hasEmail() {
		t.Fatal("the column was added while the read was open")
	}
	if err := analyst.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r.waitApplied(t, r.total, 20*time.Second, cmd, stderr)
	if !hasEmail() {
		t.Error("the column did not arrive after the read ended")
	}
	failures, slowest := stopReaders()
	if len(failures) > 0 {
		t.Errorf("%d reads failed while the service waited for its lock, e.g. %s", len(failures), failures[0])
	}
	t.Logf("slowest read: %s (lock_timeout 1s)", slowest.Round(time.Millisecond))
	deadline = time.Now().Add(10 * time.Second)
	for code, _ := readyz(t, base); code != http.StatusOK; code, _ = readyz(t, base) {
		if time.Now().After(deadline) {
			t.Fatalf("not ready again after the read ended")
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.stop(t, cmd, stderr)
	r.check(t)
	var email string
	if err := r.pool.QueryRow(ctx, "SELECT email FROM acct_history WHERE acct_id = 'NEW'").Scan(&email); err != nil || email != "nia@example.com" {
		t.Errorf("email %q, %v", email, err)
	}
}

// TestPostgresFaults injects, one after another while records stream in,
// what DESIGN.md section 6's table lists: SQLSTATEs raised by a trigger on
// the history table (disk full, out of memory, too many connections,
// cancelled, serialization failure, system error), a failover (the
// database read-only and every connection cut), a lock held past
// lock_timeout, and a column dropped by hand and put back. Each is counted
// in scd2sink_retries_total by its SQLSTATE and shows on /readyz; the
// process never exits, and the history ends equal to the fold.
func TestPostgresFaults(t *testing.T) {
	r := newCrashRig(t, 6, 100, 3)
	base := r.withHTTP(t)
	ctx := context.Background()
	exec := func(t *testing.T, sql string) {
		t.Helper()
		if _, err := r.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// The records in chunks: one before the faults, one during each.
	const chunks = 10
	chunk := func(i int) []*kgo.Record { return r.recs[i*len(r.recs)/chunks : (i+1)*len(r.recs)/chunks] }
	r.produceSync(t, chunk(0))
	cmd, stderr := r.start(t)
	r.waitApplied(t, int64(len(chunk(0))), 30*time.Second, cmd, stderr)
	var dbname string
	if err := r.pool.QueryRow(ctx, "SELECT current_database()").Scan(&dbname); err != nil {
		t.Fatal(err)
	}
	raise := func(code string) (func(*testing.T), func(*testing.T)) {
		return func(t *testing.T) {
				exec(t, fmt.Sprintf(`CREATE OR REPLACE FUNCTION inject() RETURNS trigger LANGUAGE plpgsql AS
					$$ BEGIN RAISE EXCEPTION 'injected by the test' USING ERRCODE = '%s'; END $$;
					CREATE TRIGGER inject BEFORE INSERT OR UPDATE ON acct_history FOR EACH STATEMENT EXECUTE FUNCTION inject()`, code))
			}, func(t *testing.T) {
				exec(t, "DROP TRIGGER inject ON acct_history")
			}
	}
	var locker pgx.Tx
	faults := []struct {
		name, sqlstate string
		inject, heal   func(*testing.T)
	}{
		{name: "disk full", sqlstate: "53100"},
		{name: "out of memory", sqlstate: "53200"},
		{name: "too many connections", sqlstate: "53300"},
		{name: "statement cancelled", sqlstate: "57014"},
		{name: "serialization failure", sqlstate: "40001"},
		{name: "system error", sqlstate: "58030"},
		{name: "failover: read-only", sqlstate: "25006",
			inject: func(t *testing.T) {
				exec(t, fmt.Sprintf("ALTER DATABASE %s SET default_transaction_read_only = on", pgx.Identifier{dbname}.Sanitize()))
				exec(t, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'scd2sink' AND datname = '"+dbname+"'")
			},
			heal: func(t *testing.T) {
				exec(t, fmt.Sprintf("ALTER DATABASE %s RESET default_transaction_read_only", pgx.Identifier{dbname}.Sanitize()))
				exec(t, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'scd2sink' AND datname = '"+dbname+"'")
			}},
		{name: "lock held by another session", sqlstate: "55P03",
			inject: func(t *testing.T) {
				var err error
				if locker, err = r.pool.Begin(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := locker.Exec(ctx, "LOCK TABLE acct_history IN EXCLUSIVE MODE"); err != nil {
					t.Fatal(err)
				}
			},
			heal: func(t *testing.T) { _ = locker.Rollback(ctx) }},
		{name: "column dropped by hand", sqlstate: "42703",
			inject: func(t *testing.T) {
				exec(t, "LOCK TABLE acct_history IN ACCESS EXCLUSIVE MODE; CREATE TABLE name_backup AS SELECT scd_id, name FROM acct_history; ALTER TABLE acct_history DROP COLUMN name CASCADE")
			},
			heal: func(t *testing.T) {
				exec(t, `ALTER TABLE acct_history ADD COLUMN name text;
					UPDATE acct_history h SET name = b.name FROM name_backup b WHERE b.scd_id = h.scd_id; DROP TABLE name_backup`)
			}},
	}
	if len(faults)+1 != chunks {
		t.Fatalf("%d faults, %d chunks", len(faults), chunks)
	}
	for i, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			if f.inject == nil {
				f.inject, f.heal = raise(f.sqlstate)
			}
			sample := fmt.Sprintf(`scd2sink_retries_total{sqlstate=%q}`, f.sqlstate)
			before := metric(t, base, sample)
			injected := time.Now()
			f.inject(t)
			r.produceSync(t, chunk(i+1))
			deadline := time.Now().Add(20 * time.Second)
			for metric(t, base, sample) < before+2 {
				if time.Now().After(deadline) {
					f.heal(t)
					t.Fatalf("%s: no retries counted\n%s", f.name, stderr)
				}
				if cmd.ProcessState != nil {
					t.Fatalf("scd2sink exited: %s\n%s", cmd.ProcessState, stderr)
				}
				time.Sleep(50 * time.Millisecond)
			}
			code, body := readyz(t, base)
			// A few seconds of the consumer's retries (the one loop,
			// internal/retry), which never give up.
			time.Sleep(time.Until(injected.Add(3 * time.Second)))
			if cmd.ProcessState != nil {
				t.Fatalf("scd2sink exited: %s\n%s", cmd.ProcessState, stderr)
			}
			f.heal(t)
			if code != http.StatusServiceUnavailable {
				t.Errorf("readyz during %s: %d %q", f.name, code, body)
			}
			deadline = time.Now().Add(40 * time.Second)
			for code, _ := readyz(t, base); code != http.StatusOK; code, _ = readyz(t, base) {
				if time.Now().After(deadline) {
					t.Fatalf("not ready again after %s healed\n%s", f.name, stderr)
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("%s: %.0f retries; readyz said %q", f.name, metric(t, base, sample)-before, strings.TrimSpace(body))
		})
	}
	r.waitApplied(t, r.total, 60*time.Second, cmd, stderr)
	r.stop(t, cmd, stderr)
	r.check(t)
	var dead int
	if err := r.pool.QueryRow(ctx, "SELECT count(*) FROM scd2sink_dead_letters").Scan(&dead); err != nil || dead != 0 {
		t.Errorf("%d dead letters (%v): a fault is no bad event", dead, err)
	}
}

// TestStopWhileBlocked: SIGTERM while a batch waits on a history table
// changed by hand stops the service within shutdown_timeout (nothing of
// the batch committed), and once the table is put back a restart applies
// everything: history equal to the fold.
func TestStopWhileBlocked(t *testing.T) {
	r := newCrashRig(t, 11, 20, 2)
	base := r.withHTTP(t)
	r.configure(t, "shutdown_timeout: 20s\n", "shutdown_timeout: 3s\n")
	ctx := context.Background()
	half := len(r.recs) / 2
	r.produceSync(t, r.recs[:half])
	cmd, stderr := r.start(t)
	r.waitApplied(t, int64(half), 30*time.Second, cmd, stderr)
	if _, err := r.pool.Exec(ctx, "LOCK TABLE acct_history IN ACCESS EXCLUSIVE MODE; CREATE TABLE name_backup AS SELECT scd_id, name FROM acct_history; ALTER TABLE acct_history DROP COLUMN name CASCADE"); err != nil {
		t.Fatal(err)
	}
	r.produceSync(t, r.recs[half:])
	deadline := time.Now().Add(20 * time.Second)
	for metric(t, base, `scd2sink_retries_total{sqlstate="42703"}`) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("not blocked on the dropped column\n%s", stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopped := time.Now()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		t.Logf("stopped %s after SIGTERM while blocked: %v", time.Since(stopped).Round(time.Millisecond), err)
	case <-time.After(8 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("still running 8 s after SIGTERM (shutdown_timeout 3s)\n%s", stderr)
	}
	if _, err := r.pool.Exec(ctx, `ALTER TABLE acct_history ADD COLUMN name text;
		UPDATE acct_history h SET name = b.name FROM name_backup b WHERE b.scd_id = h.scd_id; DROP TABLE name_backup`); err != nil {
		t.Fatal(err)
	}
	cmd, stderr = r.start(t)
	r.waitApplied(t, r.total, 30*time.Second, cmd, stderr)
	r.stop(t, cmd, stderr)
	r.check(t)
}
