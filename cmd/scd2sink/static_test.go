package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// startStatic starts an instance with static group membership
// (SCD2SINK_INSTANCE_ID).
func (r *crashRig) startStatic(t *testing.T, id string, flags ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"run", "--config", r.cfgFile}, flags...)...)
	cmd.Env = append(os.Environ(), "SCD2SINK_INSTANCE_ID="+id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, &stderr
}

// assignment is the group's assignment by instance ID, as "id: topic/p ...".
func (r *crashRig) assignment(t *testing.T) (string, bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	groups, err := kadm.NewClient(cl).DescribeGroups(context.Background(), "crash")
	if err != nil {
		return "", false
	}
	g := groups["crash"]
	if g.State != "Stable" {
		return "", false
	}
	var lines []string
	for _, m := range g.Members {
		id := "dynamic"
		if m.InstanceID != nil {
			id = *m.InstanceID
		}
		var parts []string
		if as, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range as.Topics {
				for _, p := range tp.Partitions {
					parts = append(parts, fmt.Sprintf("%s/%d", tp.Topic, p))
				}
			}
		}
		sort.Strings(parts)
		lines = append(lines, id+": "+strings.Join(parts, " "))
	}
	sort.Strings(lines)
	return strings.Join(lines, "; "), true
}

// TestStaticMemberRestart: with kafka.instance_id (static membership) and
// a 30 s session, a member SIGKILLed and restarted at once takes its
// partitions back without waiting for its old session: applying resumes
// within seconds, each instance keeps its partitions, and the history
// equals the fold. (A dynamic member waits out the session: 30 s here.)
func TestStaticMemberRestart(t *testing.T) {
	r := newCrashRig(t, 21, 60, 3)
	r.configure(t, "session_timeout: 2s", "session_timeout: 30s")
	third := len(r.recs) / 3
	r.produceSync(t, r.recs[:third])
	a, _ := r.startStatic(t, "scd2sink-0")
	b, bLog := r.startStatic(t, "scd2sink-1")
	r.waitApplied(t, int64(third), 60*time.Second, nil, bLog)
	var before string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if as, ok := r.assignment(t); ok && strings.Count(as, "/") == 6 && !strings.Contains(as, ": ;") {
			before = as
			break
		}
	}
	if before == "" {
		t.Fatal("the group never settled with both members")
	}
	t.Logf("assignment: %s", before)

	for i, victim := range []string{"scd2sink-0", "scd2sink-1"} {
		cmd := a
		if victim == "scd2sink-1" {
			cmd = b
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		killed := time.Now()
		restarted, log := r.startStatic(t, victim)
		if victim == "scd2sink-0" {
			a = restarted
		} else {
			b = restarted
		}
		upto := third * (i + 2)
		if i == 1 {
			upto = len(r.recs)
		}
		r.produceSync(t, r.recs[third*(i+1):upto])
		r.waitApplied(t, int64(upto), 60*time.Second, nil, log)
		took := time.Since(killed)
		t.Logf("%s SIGKILLed and restarted: the %d records produced meanwhile applied %v after the kill", victim, upto-third*(i+1), took.Round(time.Millisecond))
		if took > 10*time.Second {
			t.Errorf("resuming took %v: the restarted member waited for its old session", took)
		}
		after, _ := r.assignment(t)
		if after != before {
			t.Errorf("the assignment changed across the restart:\nbefore %s\nafter  %s", before, after)
		}
	}
	r.stop(t, a, &bytes.Buffer{})
	r.stop(t, b, &bytes.Buffer{})
	r.check(t)
}

// TestStaticMemberLeaves: a static member stays in the group when it stops
// (its partitions wait for it, 30 s here), unless it was started with
// --leave-group: then, stopped with SIGTERM, it leaves, and the other
// member takes its partitions at once and applies what comes next.
func TestStaticMemberLeaves(t *testing.T) {
	r := newCrashRig(t, 23, 40, 3)
	r.configure(t, "session_timeout: 2s", "session_timeout: 30s")
	r.configure(t, "level: warn", "level: info")
	half := len(r.recs) / 2
	r.produceSync(t, r.recs[:half])
	a, aLog := r.startStatic(t, "scd2sink-0")
	settle := func(want func(string) bool) (string, time.Duration) {
		t.Helper()
		start := time.Now()
		for deadline := start.Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if as, ok := r.assignment(t); ok && want(as) {
				return as, time.Since(start)
			}
		}
		as, _ := r.assignment(t)
		return as, -1
	}
	both := func(as string) bool {
		return strings.Count(as, "/") == 6 && strings.Count(as, ";") == 1 && !strings.Contains(as, ": ;")
	}
	for _, leave := range []bool{false, true} {
		var flags []string
		if leave {
			flags = []string{"--leave-group"}
		}
		b, bLog := r.startStatic(t, "scd2sink-1", flags...)
		if as, took := settle(both); took < 0 {
			t.Fatalf("the group never settled with both members: %s\n%s", as, bLog)
		}
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(bLog.String(), "partitions assigned"); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the member was never assigned its partitions:\n%s", bLog)
			}
		}
		r.stop(t, b, bLog)
		stopped := time.Now()
		as, took := settle(func(as string) bool { return strings.Count(as, ";") == 0 && strings.Count(as, "/") == 6 })
		switch {
		case leave && took < 0:
			t.Fatalf("stopped with --leave-group, the member is still in the group: %s\n%s", as, bLog)
		case leave:
			t.Logf("stopped with --leave-group: the other member held every partition %v after the stop", time.Since(stopped).Round(time.Millisecond))
			if !strings.Contains(bLog.String(), "left the group (--leave-group)") {
				t.Errorf("no log line says it left:\n%s", bLog)
			}
		case took >= 0:
			t.Fatalf("stopped without --leave-group, the static member left the group at once: %s", as)
		default:
			t.Logf("stopped without --leave-group: its partitions still wait for it after 10 s (%s)", as)
		}
	}
	r.produceSync(t, r.recs[half:])
	r.waitApplied(t, int64(len(r.recs)), 60*time.Second, nil, aLog)
	r.stop(t, a, aLog)
	r.check(t)
}
