package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/config"
)

// renameAcct points the rig's acct table at target (in the configuration,
// the model and the events).
func (r *crashRig) renameAcct(t *testing.T, target string) {
	t.Helper()
	r.configure(t, "    target: acct_history\n", fmt.Sprintf("    target: %q\n", target))
	for i := range r.sc.Specs {
		if r.sc.Specs[i].Target == "acct_history" {
			r.sc.Specs[i].Target = target
		}
	}
	for _, ev := range r.sc.Events {
		if ev.Table == "acct_history" {
			ev.Table = target
		}
	}
	if cols, ok := r.sc.Cols["acct_history"]; ok {
		r.sc.Cols[target] = cols
	}
}

// TestAwkwardTargetName walks a 50-byte target with quotes, spaces, $$,
// mixed case and non-ASCII through every object and command: run (with
// late events repaired and audited), a view, _as_of, verify, history,
// and rebuild's swap, whose own names for a target this long are digests.
func TestAwkwardTargetName(t *testing.T) {
	t.Parallel()
	prefix := `Kündé "Q" $$ Hïst'ory `
	target := prefix + strings.Repeat("x", 50-len(prefix))
	if len(target) != 50 || len(target) > config.MaxTargetBytes {
		t.Fatalf("target is %d bytes", len(target))
	}
	view := target + " dim"
	r := newCrashRig(t, 9, 40, 2)
	r.renameAcct(t, target)
	r.configure(t, "  - topic: src.item\n", fmt.Sprintf("    views:\n      - name: %q\n        columns: {scd_id: \"Key $$\"}\n  - topic: src.item\n", view))
	// Two halves: events of the second that belong before events of the
	// first are late, and repaired.
	half := len(r.recs) / 2
	r.produceSync(t, r.recs[:half])
	cmd, stderr := r.start(t)
	r.waitApplied(t, int64(half), 60*time.Second, cmd, stderr)
	r.produceSync(t, r.recs[half:])
	r.waitApplied(t, r.total, 60*time.Second, cmd, stderr)
	r.stop(t, cmd, stderr)
	r.check(t)

	ctx := context.Background()
	id := func(suffix string) string { return pgx.Identifier{"public", target + suffix}.Sanitize() }
	counts := func(stage string) {
		t.Helper()
		for _, q := range []string{
			"SELECT count(*) FROM " + id(""),
			"SELECT count(*) FROM " + id("_current"),
			"SELECT count(*) FROM " + id("_as_of") + "(now())",
			"SELECT count(*) FROM " + id("_scd_repairs"),
			fmt.Sprintf("SELECT count(%s) FROM %s", pgx.Identifier{"Key $$"}.Sanitize(), pgx.Identifier{"public", view}.Sanitize()),
		} {
			var n int64
			if err := r.pool.QueryRow(ctx, q).Scan(&n); err != nil || n == 0 {
				t.Errorf("%s: %s: %d rows, %v", stage, q, n, err)
			}
		}
		// No name was truncated: every object is there under its full name.
		var truncated []string
		if err := r.pool.QueryRow(ctx, `SELECT coalesce(array_agg(relname::text), '{}') FROM pg_class
			WHERE relname LIKE 'Kündé%' AND NOT (relname::text LIKE $1 || '%')`, target).Scan(&truncated); err != nil {
			t.Fatal(err)
		}
		if len(truncated) > 0 {
			t.Errorf("%s: truncated names %q", stage, truncated)
		}
	}
	counts("after run")
	var repairs int64
	_ = r.pool.QueryRow(ctx, "SELECT count(*) FROM "+id("_scd_repairs")).Scan(&repairs)
	t.Logf("%d late repairs audited", repairs)
	if code, out, errOut := run(t, "verify", "--config", r.cfgFile); code != 0 || !strings.Contains(out, target+": ok") {
		t.Errorf("verify: exit %d\n%s%s", code, out, errOut)
	}
	key := ""
	for _, ev := range r.sc.Events {
		if ev.Table == target && ev.Key != nil {
			key = ev.Key[0].(string)
			break
		}
	}
	if code, out, errOut := run(t, "history", "--config", r.cfgFile, "--table", target, "--key", key); code != 0 || !strings.Contains(out, key) {
		t.Errorf("history: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := run(t, "rebuild", "--config", r.cfgFile); code != 0 {
		t.Fatalf("rebuild: exit %d\n%s%s", code, out, errOut)
	}
	r.check(t)
	counts("after rebuild")
	var replaced int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE 'scd2sink_replaced_%' AND relkind = 'r'`).Scan(&replaced); err != nil || replaced != 2 {
		t.Errorf("%d replaced tables (history and side) kept under digest names, want 2 (%v)", replaced, err)
	}
}

// TestRebuildInterrupted kills a rebuild with SIGKILL half way and
// rebuilds again: the second one clears what the first left (offsets
// included, in a mixed-case schema) and swaps in the same history, though
// an analyst's read holds the live table for a while (its swap waits
// lock_timeout per try, and tries again).
func TestRebuildInterrupted(t *testing.T) {
	t.Parallel()
	r := newCrashRig(t, 10, 200, 3)
	r.configure(t, "  schema: public\n", "  schema: Hist\n  lock_timeout: 500ms\n")
	r.configure(t, "  batch_max_events: 200\n", "  batch_max_events: 50\n")
	for i := range r.sc.Specs {
		r.sc.Specs[i].Schema = "Hist"
	}
	r.produceSync(t, r.recs)
	ctx := context.Background()
	applied := func(group string) int64 {
		var n int64
		_ = r.pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM "Hist".scd2sink_offsets WHERE consumer_group = $1`, group).Scan(&n)
		return n
	}
	cmd, stderr := r.start(t)
	deadline := time.Now().Add(60 * time.Second)
	for applied("crash") < r.total {
		if time.Now().After(deadline) {
			t.Fatalf("run applied %d of %d\n%s", applied("crash"), r.total, stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.stop(t, cmd, stderr)

	rb := r.startWith(t, "rebuild")
	deadline = time.Now().Add(60 * time.Second)
	for n := applied("crash__rebuild"); n == 0 || n >= r.total; n = applied("crash__rebuild") {
		if time.Now().After(deadline) || n >= r.total {
			t.Fatalf("the rebuild could not be caught half way: %d of %d applied", n, r.total)
		}
		time.Sleep(2 * time.Millisecond)
	}
	_ = rb.Process.Signal(syscall.SIGKILL)
	_ = rb.Wait()
	t.Logf("rebuild killed with %d of %d records applied", applied("crash__rebuild"), r.total)

	analyst, err := r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := analyst.QueryRow(ctx, `SELECT count(*) FROM "Hist".acct_history`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(4 * time.Second) // longer than the replay and a few lock timeouts
		_ = analyst.Rollback(ctx)
	}()
	start := time.Now()
	if code, out, errOut := run(t, "rebuild", "--config", r.cfgFile); code != 0 {
		t.Fatalf("rebuild after the interrupted one: exit %d\n%s%s", code, out, errOut)
	}
	if took := time.Since(start); took < 4*time.Second {
		t.Errorf("the swap did not wait for the analyst's read (%s)", took)
	}
	r.check(t)
}

func (r *crashRig) startWith(t *testing.T, command string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(binary(t), command, "--config", r.cfgFile)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}
