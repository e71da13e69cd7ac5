package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Progress lives in PostgreSQL (DESIGN.md section 6): a partition resumes
// from scd2sink_offsets whenever it differs from Kafka's committed offset,
// behind as well as ahead, and a partition whose offset the target lost
// while its history table exists follows kafka.on_offset_lost.

// runUntil starts the binary, waits until n records are applied, and stops
// it with SIGTERM (a clean drain).
func (r *crashRig) runUntil(t *testing.T, n int64) string {
	t.Helper()
	cmd, stderr := r.start(t)
	deadline := time.Now().Add(60 * time.Second)
	for r.applied() < n && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // the signal handler is installed
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v\n%s", err, stderr.String())
	}
	if got := r.applied(); got < n {
		t.Fatalf("applied %d of %d records within 60s\n%s", got, n, stderr.String())
	}
	return stderr.String()
}

// useDatabase points the rig (its config and its pool) at another
// database of the same server, and sets extra top-level kafka keys.
func (r *crashRig) useDatabase(t *testing.T, from, to string, kafkaKeys ...string) {
	t.Helper()
	b, err := os.ReadFile(r.cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), from, to, 1)
	for _, k := range kafkaKeys {
		cfg = strings.Replace(cfg, "kafka:\n", "kafka:\n  "+k+"\n", 1)
	}
	if err := os.WriteFile(r.cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), to)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r.pool = pool
}

func (r *crashRig) dsn() string { return r.pool.Config().ConnString() }

// TestResumeFromRestoredTarget: the target database restored from a copy
// taken half-way (Kafka's committed offsets are then ahead of it) is
// brought up to date by a restart, replaying from what it holds; with the
// offsets table itself restored empty the default stops naming the
// partitions, and on_offset_lost: earliest replays from the log's start.
// Kafka's offsets deleted while PostgreSQL keeps its own resume from
// PostgreSQL's, also with start_offset: latest.
func TestResumeFromRestoredTarget(t *testing.T) {
	t.Parallel()
	for _, tc := range []string{"restored", "offsets lost", "kafka offsets deleted"} {
		t.Run(tc, func(t *testing.T) {
			r := newCrashRig(t, 7, 40, 3)
			half := len(r.recs) / 2
			r.produceSync(t, r.recs[:half])
			r.runUntil(t, int64(half))
			orig := r.dsn()
			backup := pgtest.CopyDatabase(t, orig) // the backup, taken half-way
			r.produceSync(t, r.recs[half:])
			r.runUntil(t, r.total)
			switch tc {
			case "restored":
				r.useDatabase(t, orig, backup)
				log := r.runUntil(t, r.total)
				if !strings.Contains(log, "behind Kafka's committed offset") {
					t.Errorf("no warning that scd2sink_offsets is behind Kafka's offsets:\n%s", log)
				}
			case "offsets lost":
				r.useDatabase(t, orig, backup)
				if _, err := r.pool.Exec(context.Background(), "DELETE FROM scd2sink_offsets"); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				cmd := exec.CommandContext(ctx, binary(t), "run", "--config", r.cfgFile)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				err := cmd.Run()
				if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(stderr.String(), "progress lost (kafka.on_offset_lost is fail)") ||
					!strings.Contains(stderr.String(), "topic src.acct partition 0") {
					t.Fatalf("with scd2sink_offsets emptied: exit %d (%v), want 1 naming the partitions:\n%s", code, err, stderr.String())
				}
				r.useDatabase(t, backup, backup, "on_offset_lost: earliest")
				log := r.runUntil(t, r.total)
				defer func() {
					if t.Failed() {
						t.Logf("the replay's log:\n%s", log)
					}
				}()
			case "kafka offsets deleted":
				cl, err := kgo.NewClient(kgo.SeedBrokers(r.kafka.ListenAddrs()...))
				if err != nil {
					t.Fatal(err)
				}
				defer cl.Close()
				if _, err := kadm.NewClient(cl).DeleteGroup(context.Background(), "crash"); err != nil {
					t.Fatal(err)
				}
				more := r.recs[:20] // delivered again: duplicates after the resume
				r.useDatabase(t, orig, orig, "start_offset: latest")
				cmd, stderr := r.start(t)
				time.Sleep(3 * time.Second) // joined and placed
				r.produceSync(t, more)
				deadline := time.Now().Add(30 * time.Second)
				for r.applied() < r.total+int64(len(more)) && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
				}
				_ = cmd.Process.Signal(syscall.SIGTERM)
				if err := cmd.Wait(); err != nil {
					t.Fatalf("after SIGTERM: %v\n%s", err, stderr.String())
				}
				if got := r.applied(); got != r.total+int64(len(more)) {
					t.Fatalf("applied %d records, want %d", got, r.total+int64(len(more)))
				}
				r.total += int64(len(more))
			}
			r.check(t)
		})
	}
}
