package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestReconciliationGuardCommand: through the binary, a full snapshot
// that reads 1 of 5 customers (a filtering snapshot.select.statement.overrides)
// would close 4: the guard (snapshot_deletes_max_fraction 0.5) holds it.
// Nothing is closed; scd2sink_reconciliations_held is 1; `tables` shows
// it; `reconcile` without --confirm prints it and exits 2. With --confirm,
// while run goes on, the four are closed at the snapshot's time (a change
// after the snapshot stays after it), the metric returns to 0, and a
// second confirm exits 1: nothing is held.
func TestReconciliationGuardCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "plan", Schema: `{"type":"string","optional":true}`}}}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, src.Topic()))
	if err != nil {
		t.Fatal(err)
	}
	defer kafka.Close()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	day := func(d int) time.Time { return time.Date(2026, 3, d, 12, 0, 0, 0, time.UTC) }
	rec := func(c scdtest.Change) *kgo.Record {
		k, v := src.Envelope(c)
		return &kgo.Record{Topic: src.Topic(), Key: k, Value: v}
	}
	row := func(id int, plan string) scdtest.Row { return scdtest.Row{"id": id, "plan": plan} }
	var recs []*kgo.Record
	for id := 1; id <= 5; id++ {
		recs = append(recs, rec(scdtest.Change{Op: "c", After: row(id, "basic"), LSN: int64(100 + id), Commit: day(1)}))
	}
	recs = append(recs, rec(scdtest.Change{Op: "r", After: row(1, "basic"), LSN: 500, Commit: day(4), Snapshot: "last"}),
		rec(scdtest.Change{Op: "u", After: row(2, "pro"), LSN: 600, Commit: day(6)}))
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	addr := freeAddr(t)
	cfgFile := filepath.Join(t.TempDir(), "scd2sink.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf(`kafka: {brokers: %s, group_id: guard}
postgres: {dsn: %q}
http: {addr: %q}
sequencer: {reorder_window: 50ms}
sink: {batch_max_wait: 20ms}
tables:
  - {topic: %s, target: customers_history, keys: [id], snapshot_deletes: close}
`, brokers, dsn, addr, src.Topic())), 0o600); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary(t), "run", "--config", cfgFile)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	waitApplied(t, pool, int64(len(recs)), time.Minute)
	waitFor(t, pool, `SELECT count(*) = 1 FROM scd2sink_snapshots WHERE held_at IS NOT NULL AND held_keys = 4 AND live_keys = 5`, 30*time.Second)
	history := func() string {
		t.Helper()
		var s string
		if err := pool.QueryRow(ctx, `SELECT string_agg(id || ' ' || plan || ' ' || to_char(valid_from, 'DD') || '-' || coalesce(to_char(valid_to, 'DD'), ''), ', ' ORDER BY id, valid_from) FROM customers_history`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got, want := history(), "1 basic 01-, 2 basic 01-06, 2 pro 06-, 3 basic 01-, 4 basic 01-, 5 basic 01-"; got != want {
		t.Fatalf("held: history %q, want %q (nothing closed)", got, want)
	}
	base := "http://" + addr
	if n := metric(t, base, "scd2sink_reconciliations_held"); n != 1 {
		t.Errorf("scd2sink_reconciliations_held %v while held, want 1", n)
	}
	out, err := exec.Command(binary(t), "tables", "--config", cfgFile).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "reconciliation held: would close 4 of 5 live keys") {
		t.Errorf("tables (%v):\n%s", err, out)
	}
	c := exec.Command(binary(t), "reconcile", "--config", cfgFile, "--table", "customers_history")
	out, err = c.CombinedOutput()
	if c.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "closes 4 of 5 live keys") || !strings.Contains(string(out), "--confirm") {
		t.Errorf("reconcile without --confirm: exit %d (%v)\n%s", c.ProcessState.ExitCode(), err, out)
	}
	out, err = exec.Command(binary(t), "reconcile", "--config", cfgFile, "--table", "customers_history", "--confirm").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "customers_history: applied") {
		t.Fatalf("reconcile --confirm: %v\n%s", err, out)
	}
	// Closed at the snapshot's time (day 4); 2's change on day 6 re-opens it after.
	if got, want := history(), "1 basic 01-, 2 basic 01-04, 2 pro 06-, 3 basic 01-04, 4 basic 01-04, 5 basic 01-04"; got != want {
		t.Fatalf("confirmed: history %q, want %q", got, want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, base, "scd2sink_reconciliations_held") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("scd2sink_reconciliations_held stays above 0 after the confirmation")
		}
		time.Sleep(100 * time.Millisecond)
	}
	c = exec.Command(binary(t), "reconcile", "--config", cfgFile, "--table", "customers_history", "--confirm")
	out, _ = c.CombinedOutput()
	if c.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "no reconciliation of the table is held") {
		t.Errorf("second confirm: exit %d\n%s", c.ProcessState.ExitCode(), out)
	}
	// run goes on exactly over the repaired history.
	if err := cl.ProduceSync(ctx, rec(scdtest.Change{Op: "u", After: row(1, "pro"), LSN: 700, Commit: day(7)})).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, pool, int64(len(recs)+1), time.Minute)
	if got, want := history(), "1 basic 01-07, 1 pro 07-, 2 basic 01-04, 2 pro 06-, 3 basic 01-04, 4 basic 01-04, 5 basic 01-04"; got != want {
		t.Fatalf("after: history %q, want %q", got, want)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("scd2sink: %v", err)
	}
	if out, err := exec.Command(binary(t), "verify", "--config", cfgFile).CombinedOutput(); err != nil {
		t.Fatalf("verify: %v\n%s", err, out)
	}
}
