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

// TestReaderFeatures runs the binary over Debezium envelopes in three
// partitions with a late change and a full snapshot that misses two keys,
// and reads the result the ways issue 9 gives readers: the history (the
// missed keys closed at the snapshot's time), <target>_as_of, a convention
// view, the repair audit and `scd2sink history`.
func TestReaderFeatures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "plan", Schema: `{"type":"string","optional":true}`}}}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, src.Topic()))
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
	var phaseA, phaseB []*kgo.Record
	for id := 1; id <= 4; id++ {
		phaseA = append(phaseA, rec(scdtest.Change{Op: "c", After: row(id, "basic"), LSN: int64(100 + id), Commit: day(1)}))
	}
	phaseA = append(phaseA, rec(scdtest.Change{Op: "u", After: row(1, "pro"), LSN: 300, Commit: day(3)}))
	phaseB = append(phaseB, rec(scdtest.Change{Op: "u", After: row(1, "team"), LSN: 200, Commit: day(2)}), // late
		rec(scdtest.Change{Op: "r", After: row(1, "pro"), LSN: 500, Commit: day(4), Snapshot: "first"}),
		rec(scdtest.Change{Op: "r", After: row(2, "basic"), LSN: 500, Commit: day(4), Snapshot: "last"}))
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfgFile := filepath.Join(t.TempDir(), "scd2sink.yaml")
	cfg := fmt.Sprintf(`kafka: {brokers: %s, group_id: feat}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 50ms}
sink: {batch_max_wait: 20ms}
tables:
  - topic: %s
    target: customers_history
    keys: [id]
    track_history: [plan]
    snapshot_deletes: close
    views:
      - {name: dim_customer, grain: day, end: inclusive, current_end: "9999-12-31", columns: {scd_id: customer_key}}
`, brokers, dsn, src.Topic())
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, phaseA...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary(t), "run", "--config", cfgFile)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	waitApplied(t, pool, int64(len(phaseA)), time.Minute)
	if err := cl.ProduceSync(ctx, phaseB...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, pool, int64(len(phaseA)+len(phaseB)), time.Minute)
	waitFor(t, pool, `SELECT count(*) = 1 FROM scd2sink_snapshots WHERE done_at IS NOT NULL`, 30*time.Second)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("scd2sink: %v", err)
	}

	query := func(q string, args ...any) string {
		t.Helper()
		var s string
		if err := pool.QueryRow(ctx, q, args...).Scan(&s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return s
	}
	t.Run("history: the keys the snapshot missed closed at its time", func(t *testing.T) {
		got := query(`SELECT string_agg(id || ' ' || plan || ' ' || to_char(valid_from, 'DD') || '-' || coalesce(to_char(valid_to, 'DD'), ''), ', ' ORDER BY id, valid_from) FROM customers_history`)
		want := "1 basic 01-02, 1 team 02-03, 1 pro 03-, 2 basic 01-, 3 basic 01-04, 4 basic 01-04"
		if got != want {
			t.Fatalf("history %q, want %q", got, want)
		}
	})
	t.Run("as_of", func(t *testing.T) {
		if got := query(`SELECT plan FROM customers_history_as_of($1) WHERE id = 1`, day(2).Add(time.Hour)); got != "team" {
			t.Fatalf("plan of 1 on day 2: %q", got)
		}
		if got := query(`SELECT count(*)::text FROM customers_history_as_of($1)`, day(5)); got != "2" {
			t.Fatalf("%s customers valid on day 5, want 2", got)
		}
	})
	t.Run("view", func(t *testing.T) {
		got := query(`SELECT string_agg(id || ' ' || valid_from || ' ' || valid_to, ', ' ORDER BY id, valid_from) FROM dim_customer WHERE id IN (1, 3)`)
		want := "1 2026-03-01 2026-03-01, 1 2026-03-02 2026-03-02, 1 2026-03-03 9999-12-31, 3 2026-03-01 2026-03-03"
		if got != want {
			t.Fatalf("dim_customer %q, want %q", got, want)
		}
	})
	t.Run("repair audit", func(t *testing.T) {
		got := query(`SELECT string_agg(key::text || ' ' || jsonb_array_length(before) || '->' || jsonb_array_length(after), ', ') FROM customers_history_scd_repairs`)
		// The late change splits one version of 1 in two: the audit holds
		// that version before and the two after, not the untouched one.
		if !strings.Contains(got, `{"id": 1} 1->2`) {
			t.Fatalf("repairs %q, want the late change of 1 (1 version -> 2)", got)
		}
	})
	t.Run("history command", func(t *testing.T) {
		out, err := exec.Command(binary(t), "history", "--config", cfgFile, "--table", src.Topic(), "--key", "1", "--at", "2026-03-02T13:00:00Z").Output()
		if err != nil || !strings.Contains(string(out), "team") || strings.Count(strings.TrimSpace(string(out)), "\n") != 1 {
			t.Fatalf("history: %v\n%s", err, out)
		}
	})
}

// waitFor polls a boolean query until it is true.
func waitFor(t *testing.T, pool *pgxpool.Pool, q string, within time.Duration) {
	t.Helper()
	end := time.Now().Add(within)
	for time.Now().Before(end) {
		var ok bool
		if err := pool.QueryRow(context.Background(), q).Scan(&ok); err == nil && ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("not within %s: %s", within, q)
}
