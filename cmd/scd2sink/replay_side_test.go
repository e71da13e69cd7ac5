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

// TestReplayAfterWidening is DESIGN section 7's story: the history table
// was created narrow (note varchar(6), by the DBA), so the service's side
// table got varchar(6) too; changes of note that do not fit are
// dead-lettered — Type 1 changes, which write side rows too. The
// operator widens the history column (only that: our side table is ours),
// and `dead-letters replay --all` applies every one: the side table
// follows the history table's type. The history then equals the fold.
func TestReplayAfterWidening(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "plan", Schema: `{"type":"string","optional":true}`},
			{Name: "note", Schema: `{"type":"string","optional":true}`}}}
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
	if _, err := pool.Exec(ctx, `CREATE TABLE customers_history (id integer, plan text, note varchar(6))`); err != nil {
		t.Fatal(err)
	}
	day := func(d int) time.Time { return time.Date(2026, 3, d, 12, 0, 0, 0, time.UTC) }
	rec := func(op string, id int, plan, note string, lsn int64, d int) *kgo.Record {
		k, v := src.Envelope(scdtest.Change{Op: op, After: scdtest.Row{"id": id, "plan": plan, "note": note}, LSN: lsn, Commit: day(d)})
		return &kgo.Record{Topic: src.Topic(), Key: k, Value: v}
	}
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfgFile := filepath.Join(t.TempDir(), "scd2sink.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf(`kafka: {brokers: %s, group_id: widen}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 50ms}
sink: {batch_max_wait: 20ms}
tables:
  - {topic: %s, target: customers_history, keys: [id], track_history: [plan]}
`, brokers, dsn, src.Topic())), 0o600); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(recs ...*kgo.Record) {
		t.Helper()
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(binary(t), "run", "--config", cfgFile)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	produce(rec("c", 1, "basic", "a", 100, 1), rec("c", 2, "basic", "b", 110, 1))
	waitApplied(t, pool, 2, time.Minute)
	// Two Type 1 changes (each a side row and the versions' note) whose
	// note does not fit: both rejected.
	produce(rec("u", 1, "basic", "much too long", 200, 2), rec("u", 2, "basic", "also far too long", 210, 2),
		rec("u", 1, "pro", "ok", 300, 3))
	waitApplied(t, pool, 5, time.Minute)
	waitFor(t, pool, `SELECT count(*) = 2 FROM scd2sink_dead_letters`, 30*time.Second)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("scd2sink: %v", err)
	}
	var sideType string
	if err := pool.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'customers_history_scd_events'::regclass AND attname = 'note'`).Scan(&sideType); err != nil || sideType != "character varying(6)" {
		t.Fatalf("side table's note is %q (%v), want the history table's character varying(6)", sideType, err)
	}
	// The operator widens the history column, as README says.
	if _, err := pool.Exec(ctx, `DO $$ DECLARE d text := pg_get_viewdef('customers_history_current'); dc text := pg_get_viewdef('customers_history_consistent');
		c text := obj_description('customers_history_current'::regclass);
		BEGIN
			DROP VIEW customers_history_current, customers_history_consistent;
			ALTER TABLE customers_history ALTER COLUMN note TYPE varchar(40);
			EXECUTE 'CREATE VIEW customers_history_current AS ' || d;
			EXECUTE 'CREATE VIEW customers_history_consistent AS ' || dc;
			EXECUTE format('COMMENT ON VIEW customers_history_current IS %L', c);
		END $$`); err != nil {
		t.Fatal(err)
	}
	c := exec.Command(binary(t), "dead-letters", "replay", "--config", cfgFile, "--all")
	out, _ := c.CombinedOutput()
	if code := c.ProcessState.ExitCode(); code != 0 || !strings.Contains(string(out), "2 replayed, 0 failed again") {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	var got string
	if err := pool.QueryRow(ctx, `SELECT string_agg(id || ' ' || plan || ' ' || note || ' ' || to_char(valid_from, 'DD') || '-' || coalesce(to_char(valid_to, 'DD'), ''), ', ' ORDER BY id, valid_from) FROM customers_history`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	// all_versions: every version carries its key's last note.
	if want := "1 basic ok 01-03, 1 pro ok 03-, 2 basic also far too long 01-"; got != want {
		t.Fatalf("after the replay: %q, want %q", got, want)
	}
	if out, err := exec.Command(binary(t), "verify", "--config", cfgFile).CombinedOutput(); err != nil {
		t.Fatalf("verify: %v\n%s", err, out)
	}
}
