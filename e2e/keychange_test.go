//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// keyChangeBudget is what a primary-key change may take from the source's
// commit until the new key is current (the connector polls every 100ms:
// poll.interval.ms, 500ms by default, is Debezium's share), and the longest the group's
// committed offsets may trail the log meanwhile: runSink's reorder_window
// (200ms) plus a second (issue 14).
const keyChangeBudget = 200*time.Millisecond + time.Second

// checkKeyChanges changes the primary key of n live customers, one
// transaction each, with nothing else running, and measures the time from
// each commit at the source to the new key being current in the history,
// and the longest stretch the group's committed offsets trailed the end of
// the log. Both must stay within keyChangeBudget.
//
// A 2-core machine stalls now and then (a checkpoint, the JIT of the
// broker): a round with a change over budget is measured once more, and
// the check fails only when both rounds do. A key change that waits for
// the key-change wait (5 s) fails both.
func checkKeyChanges(t *testing.T, ctx context.Context, st *stack, w *workload, n int) {
	t.Helper()
	for round := 1; ; round++ {
		worst, worstOurs, longest := keyChangeRound(t, ctx, st, w, n)
		t.Logf("primary-key changes, round %d: slowest %v from the source's commit, %v from Kafka; committed offsets trailed the log at most %v (budget %v)",
			round, worst.Round(time.Millisecond), worstOurs.Round(time.Millisecond), longest.Round(time.Millisecond), keyChangeBudget)
		if worst <= keyChangeBudget && worstOurs <= keyChangeBudget && longest <= keyChangeBudget {
			return
		}
		if round == 2 {
			t.Errorf("primary-key changes over reorder_window + 1s in two rounds: slowest %v from the source's commit, %v from Kafka, offsets trailed %v",
				worst.Round(time.Millisecond), worstOurs.Round(time.Millisecond), longest.Round(time.Millisecond))
			return
		}
	}
}

// keyChangeRound makes n primary-key changes and returns the slowest from
// the source's commit and from Kafka, and the longest the committed
// offsets trailed the log.
func keyChangeRound(t *testing.T, ctx context.Context, st *stack, w *workload, n int) (worst, worstOurs, longest time.Duration) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(st.kafka.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	stall := watchCommits(ctx, adm, "scd2sink", []string{"shop.public.customers", "shop.public.accounts"})
	// The creates of key changes as they reach Kafka: Debezium's share.
	reader, err := kgo.NewClient(kgo.SeedBrokers(st.kafka.addr()), kgo.ConsumeTopics("shop.public.customers"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	arrived := make(chan time.Time, 64)
	rctx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	go func() {
		for rctx.Err() == nil {
			reader.PollFetches(rctx).EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == "__debezium.oldkey" {
						arrived <- time.Now()
					}
				}
			})
		}
	}()
	time.Sleep(time.Second) // the reader has listed its offsets
	for i := 0; i < n; i++ {
		old := w.anyLive()
		moved := old + 200_000
		for w.live[moved] { // taken: a key moved in an earlier round
			moved += 200_000
		}
		if _, err := st.src.pool.Exec(ctx, `UPDATE customers SET id = $2, plan = 'moved' WHERE id = $1`, old, moved); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		delete(w.live, old)
		w.live[moved] = true
		for {
			var ok bool
			if err := st.tpool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM customers_history WHERE id = $1 AND is_current AND bio IS NOT NULL)`, moved).Scan(&ok); err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
			if time.Since(committed) > 30*time.Second {
				t.Fatalf("key change %d→%d never became current", old, moved)
			}
			time.Sleep(5 * time.Millisecond)
		}
		current := time.Now()
		inKafka := current
		select {
		case inKafka = <-arrived:
		case <-time.After(5 * time.Second):
			t.Errorf("the reader never saw the create of key change %d→%d", old, moved)
		}
		took, ours := current.Sub(committed), current.Sub(inKafka)
		worst, worstOurs = max(worst, took), max(worstOurs, ours)
		t.Logf("primary-key change %d→%d: new key current %v after the source's commit (Debezium %v, scd2sink %v)", old, moved,
			took.Round(time.Millisecond), inKafka.Sub(committed).Round(time.Millisecond), ours.Round(time.Millisecond))
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(keyChangeBudget)
	return worst, worstOurs, stall()
}

// watchCommits polls the group's committed offsets against the end of the
// topics' logs until the returned function is called; that returns the
// longest stretch during which some partition's commit trailed its end.
func watchCommits(ctx context.Context, adm *kadm.Client, group string, topics []string) func() time.Duration {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var longest time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		caughtUp := time.Now()
		for ctx.Err() == nil {
			ends, err1 := adm.ListEndOffsets(ctx, topics...)
			commits, err2 := adm.FetchOffsets(ctx, group)
			if err1 == nil && err2 == nil {
				behind := false
				ends.Each(func(o kadm.ListedOffset) {
					if c, ok := commits.Lookup(o.Topic, o.Partition); o.Offset > 0 && (!ok || c.At < o.Offset) {
						behind = true
					}
				})
				now := time.Now()
				if !behind {
					caughtUp = now
				}
				mu.Lock()
				longest = max(longest, now.Sub(caughtUp))
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() time.Duration {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return longest
	}
}

// TestStaticMemberRestart: on the real stack, an instance with static
// membership (SCD2SINK_INSTANCE_ID) SIGKILLed and restarted at once takes
// its partitions back without waiting for its old session (10 s here):
// a change committed at the source right after each restart is current in
// the history within a few seconds, and the history equals the source.
func TestStaticMemberRestart(t *testing.T) {
	skipOnCompose(t)
	ctx := context.Background()
	st := newStack(t, ctx, 3)
	w := newWorkload(5)
	env := "SCD2SINK_INSTANCE_ID=scd2sink-0"
	sinkProc := runSink(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN, env)
	if err := w.run(ctx, st.src.pool, 100, 100); err != nil {
		t.Fatal(err)
	}
	st.converge(t, ctx, 120*time.Second, sinkProc, st.conn.proc)
	var worst time.Duration
	for i := 0; i < 3; i++ {
		sinkProc.kill()
		killed := time.Now()
		sinkProc = runSink(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN, env)
		id := w.anyLive()
		plan := fmt.Sprintf("restart-%d", i)
		if _, err := st.src.pool.Exec(ctx, `UPDATE customers SET plan = $2 WHERE id = $1`, id, plan); err != nil {
			t.Fatal(err)
		}
		for {
			var ok bool
			if err := st.tpool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM customers_history WHERE id = $1 AND plan = $2 AND is_current)`, id, plan).Scan(&ok); err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
			if time.Since(killed) > 60*time.Second {
				t.Fatalf("the change after restart %d never arrived\n%s", i+1, sinkProc.tail(20))
			}
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(killed)
		worst = max(worst, took)
		t.Logf("static member SIGKILLed and restarted (%d): a change committed after the restart was current %v after the kill", i+1, took.Round(time.Millisecond))
	}
	if worst > 5*time.Second {
		t.Errorf("a restart took %v to resume: the member waited for its old session (10 s)", worst.Round(time.Millisecond))
	}
	n := st.converge(t, ctx, 60*time.Second, sinkProc, st.conn.proc)
	t.Logf("after three SIGKILLs of a static member: history equals the source, %d versions", n)
}
