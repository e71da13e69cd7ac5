package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/twmb/franz-go/pkg/kgo"
)

// startNamed starts an instance whose PostgreSQL sessions carry
// application_name name (through its DSN), logging at info.
func (r *crashRig) startNamed(t *testing.T, name string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	raw, err := os.ReadFile(r.cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(raw), "  level: warn\n", "  level: info\n", 1)
	i := strings.Index(cfg, "  dsn: \"")
	j := strings.Index(cfg[i+8:], "\"")
	dsn := cfg[i+8 : i+8+j]
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	cfg = cfg[:i+8] + dsn + sep + "application_name=" + name + cfg[i+8+j:]
	f := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(f, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary(t), "run", "--config", f)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, &stderr
}

// TestExpelledMemberCommitsNothing: two instances share the group. The
// owner of src.acct is stopped (SIGSTOP) in the middle of a batch — its
// transaction open, holding the partition's lock — for longer than the
// session timeout; the other takes the partition over and applies what
// arrives meanwhile. Continued (SIGCONT), the stopped member must commit
// nothing of its stale batch: every offset any transaction tried to record
// is recorded in commit order, and per partition those never go
// backwards. The history equals the fold and every offset is committed.
func TestExpelledMemberCommitsNothing(t *testing.T) {
	ctx := context.Background()
	r := newCrashRig(t, 11, 30, 1)
	half := len(r.recs) / 2
	r.produceSync(t, r.recs[:half])
	a, aLog := r.startNamed(t, "member-a")
	b, bLog := r.startNamed(t, "member-b")
	r.waitApplied(t, int64(half), 60*time.Second, nil, aLog)

	// What every transaction tried to record, in commit order (a BEFORE
	// INSERT trigger sees the offset proposed, before ON CONFLICT keeps
	// the higher one); and a batch holding key SLOW takes 3 s.
	for _, q := range []string{
		`CREATE TABLE offset_attempts (app text, topic text, part int, next_offset bigint, at timestamptz DEFAULT clock_timestamp())`,
		`CREATE FUNCTION note_attempt() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
			INSERT INTO offset_attempts (app, topic, part, next_offset) VALUES (current_setting('application_name'), NEW.topic, NEW.partition, NEW.next_offset);
			RETURN NEW; END $$`,
		`CREATE TRIGGER note_attempt BEFORE INSERT ON scd2sink_offsets FOR EACH ROW EXECUTE FUNCTION note_attempt()`,
		`CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
			IF EXISTS (SELECT FROM new_rows WHERE acct_id = 'SLOW') THEN PERFORM pg_sleep(3); END IF; RETURN NULL; END $$`,
		`CREATE TRIGGER slow AFTER INSERT ON acct_history REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION slow()`,
	} {
		if _, err := r.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Which member owns src.acct: the one recording its offsets.
	acct := func(id string, seq int64) *change.Event {
		return &change.Event{Table: "acct_history", Key: []any{id}, Op: change.OpCreate, Seq: change.MustSeq(seq),
			ValidFrom: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), After: map[string]any{"acct_id": id, "plan": "pro"}}
	}
	spec := r.sc.Specs[0]
	probe := acct("PROBE", 1<<40)
	r.sc.Events = append(r.sc.Events, probe)
	r.produceSync(t, append(r.recs[half:half+1:half+1], debeziumRecord(probe, spec, "src.acct")))
	var owner string
	for deadline := time.Now().Add(30 * time.Second); owner == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_ = r.pool.QueryRow(ctx, `SELECT app FROM offset_attempts WHERE topic = 'src.acct' ORDER BY at DESC LIMIT 1`).Scan(&owner)
	}
	stopped, stoppedLog, other := a, aLog, bLog
	switch owner {
	case "member-a":
	case "member-b":
		stopped, stoppedLog, other = b, bLog, aLog
	default:
		t.Fatalf("no member recorded src.acct's offsets (%q)\na:\n%s\nb:\n%s", owner, aLog, bLog)
	}
	t.Logf("%s owns src.acct", owner)

	slow := acct("SLOW", 1<<40+1)
	r.sc.Events = append(r.sc.Events, slow)
	r.total += 2
	r.produceSync(t, []*kgo.Record{debeziumRecord(slow, spec, "src.acct")})
	time.Sleep(time.Second) // its batch sleeps in PostgreSQL
	if err := stopped.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopAt := time.Now()
	r.produceSync(t, r.recs[half+1:]) // the other member takes these
	time.Sleep(8 * time.Second)       // past the 2s session; its transaction is cut after 3s + 2s idle
	if err := stopped.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s stopped for %v", owner, time.Since(stopAt).Round(time.Millisecond))
	r.waitApplied(t, r.total, 90*time.Second, nil, other)
	time.Sleep(time.Second)

	rows, err := r.pool.Query(ctx, `SELECT app, topic, part, next_offset, at FROM offset_attempts ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		topic string
		part  int32
	}
	high := map[key]int64{}
	var backwards []string
	for rows.Next() {
		var app, topic string
		var part int32
		var off int64
		var at time.Time
		if err := rows.Scan(&app, &topic, &part, &off, &at); err != nil {
			t.Fatal(err)
		}
		k := key{topic, part}
		if off < high[k] {
			backwards = append(backwards, fmt.Sprintf("%s recorded %s/%d@%d after %d (%v after the stop)", app, topic, part, off, high[k], at.Sub(stopAt).Round(time.Millisecond)))
		}
		high[k] = max(high[k], off)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(backwards) > 0 {
		t.Errorf("a stale batch was committed:\n%s\n%s log:\n%s", strings.Join(backwards, "\n"), owner, stoppedLog)
	}
	if !strings.Contains(stoppedLog.String(), "partitions lost") && !strings.Contains(stoppedLog.String(), "abandoned") {
		t.Errorf("the stopped member never noticed it was expelled:\n%s", stoppedLog)
	}
	if testing.Verbose() {
		t.Logf("%s log:\n%s", owner, stoppedLog)
	}
	r.stop(t, a, aLog)
	r.stop(t, b, bLog)
	r.check(t)
}
