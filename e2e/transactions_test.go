//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// bankTables are TestTransactions' two tables of accounts.
var bankTables = []srcTable{
	{"checking", sink.TableSpec{Target: "checking_history", Schema: "public", Keys: []string{"id"}}, []string{"balance"}},
	{"savings", sink.TableSpec{Target: "savings_history", Schema: "public", Keys: []string{"id"}}, []string{"balance"}},
}

// TestTransactions: Debezium's PostgreSQL connector with
// provide.transaction.metadata=true captures two tables of accounts
// (topics of 2 and 3 partitions) and scd2sink reads them with
// transaction_topic, savings_history under history_constraint:
// no_overlap. Source transactions move money between accounts of either
// table, one to three transfers each, while the sum over every account
// read through the _consistent views is taken every 50 ms: it is the
// total at every poll. Both histories then equal the source's audit log,
// the constraint is on savings_history, and the transactions recorded
// are pruned.
func TestTransactions(t *testing.T) {
	skipOnCompose(t)
	ctx := context.Background()
	const accounts, initial = 20, 1000
	st := newStackWith(t, ctx, stackOpts{capture: `public[.](checking|savings)`, connector: "provide.transaction.metadata=true\n",
		before: func(st *stack) {
			for _, tb := range bankTables {
				if _, err := st.src.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (id int PRIMARY KEY, balance bigint NOT NULL);
					CREATE TRIGGER %[1]s_audit AFTER INSERT OR UPDATE OR DELETE ON %[1]s FOR EACH ROW EXECUTE FUNCTION audit()`, tb.name)); err != nil {
					t.Fatal(err)
				}
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(st.kafka.addr()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			for topic, n := range map[string]int32{"shop.public.checking": 2, "shop.public.savings": 3} {
				if resp, err := kadm.NewClient(cl).CreateTopic(ctx, n, 1, nil, topic); err != nil || resp.Err != nil {
					t.Fatalf("creating %s: %v %v", topic, err, resp.Err)
				}
			}
		}})
	// The administrator's part of no_overlap.
	if _, err := st.tpool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS btree_gist`); err != nil {
		t.Fatal(err)
	}
	sinkProc := runSinkTables(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN, `defaults:
  transaction_topic: shop.transaction
tables:
  - {topic: shop.public.checking, target: checking_history}
  - {topic: shop.public.savings, target: savings_history, history_constraint: no_overlap}
`)
	// The accounts open in one transaction.
	if _, err := st.src.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO checking SELECT g, %[1]d FROM generate_series(1, %[2]d) g;
		INSERT INTO savings SELECT g, %[1]d FROM generate_series(1, %[2]d) g`, initial, accounts)); err != nil {
		t.Fatal(err)
	}
	const total = 2 * accounts * initial
	// Once the consistent views have an instant (Debezium created the
	// transaction topic, scd2sink reads it), money moves
	// (complete through the last commit less the reorder window: the
	// accounts show once a later transaction carries it past them).
	if err := waitFor(ctx, 60*time.Second, func() (bool, error) {
		var at *time.Time
		err := st.tpool.QueryRow(ctx, `SELECT scd2sink_consistent_through()`).Scan(&at)
		return err == nil && at != nil, nil
	}); err != nil {
		t.Fatalf("the opening transaction never became visible: %v\n%s\n%s", err, transactionState(t, st), sinkProc.tail(30))
	}

	var mu sync.Mutex
	polls, seen, summed := 0, 0, 0
	var wrong []string
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			var at *time.Time
			var sum *int64
			err := pgx.BeginTxFunc(ctx, st.tpool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, `SELECT scd2sink_consistent_through(),
					(SELECT sum(balance) FROM checking_history_consistent) + (SELECT sum(balance) FROM savings_history_consistent)`).Scan(&at, &sum)
			})
			mu.Lock()
			polls++
			if err == nil && at != nil {
				seen++
				if sum != nil && *sum != total { // nil: as of before the accounts opened
					wrong = append(wrong, fmt.Sprintf("as of %s: %v", at.Format(time.RFC3339Nano), *sum))
				} else if sum != nil {
					summed++
				}
			}
			mu.Unlock()
		}
	}()

	rng := rand.New(rand.NewPCG(51, 4))
	for i := 0; i < 400; i++ {
		tx, err := st.src.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for range 1 + rng.IntN(3) {
			from, to := bankTables[rng.IntN(2)].name, bankTables[rng.IntN(2)].name
			a, b, amount := 1+rng.IntN(accounts), 1+rng.IntN(accounts), 1+rng.IntN(50)
			if from == to && a == b {
				continue
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET balance = balance - $2 WHERE id = $1`, from), a, amount); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET balance = balance + $2 WHERE id = $1`, to), b, amount); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // about 8 s of transfers: polls fall between them
	}
	// The consistent views reach the source's last state.
	var last time.Time
	if err := st.src.pool.QueryRow(ctx, `SELECT max(pg_xact_commit_timestamp(xmin)) FROM (SELECT xmin FROM checking UNION ALL SELECT xmin FROM savings) x`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 120*time.Second, func() (bool, error) {
		var at *time.Time
		err := st.tpool.QueryRow(ctx, `SELECT scd2sink_consistent_through()`).Scan(&at)
		return err == nil && at != nil && !at.Before(last.Truncate(time.Millisecond).Add(-time.Second)), err
	}); err != nil {
		t.Fatalf("the consistent views never reached the last transfer (%s): %v\n%s\n%s", last, err, transactionState(t, st), sinkProc.tail(30))
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-watched
	mu.Lock()
	t.Logf("%d polls, %d through the consistent views (%d with the accounts open), %d wrong", polls, seen, summed, len(wrong))
	if len(wrong) > 0 {
		t.Errorf("the accounts read through the consistent views did not sum to %d in %d polls: %v", total, len(wrong), wrong[:min(5, len(wrong))])
	}
	if summed < 20 {
		t.Errorf("only %d polls saw a consistent instant\n%s", seen, sinkProc.tail(40))
	}
	mu.Unlock()
	for _, tb := range bankTables {
		want := truth(t, ctx, st.src, tb)
		var got []string
		if err := waitFor(ctx, 60*time.Second, func() (bool, error) {
			got = stripSeq(scdtest.HistoryLines(t, st.tpool, tb.spec, tb.cols))
			return scdtest.DiffLines(want, got) == "", nil
		}); err != nil {
			t.Fatalf("%s never matched the source: %v\n%s", tb.spec.Target, err, scdtest.DiffLines(want, got))
		}
	}
	var constraint, pending int
	if err := st.tpool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conname = 'savings_history_scd_excl' AND contype = 'x'`).Scan(&constraint); err != nil || constraint != 1 {
		t.Errorf("savings_history has %d no-overlap constraints (%v)", constraint, err)
	}
	if err := waitFor(ctx, 10*time.Second, func() (bool, error) {
		err := st.tpool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_transactions`).Scan(&pending)
		return err == nil && pending == 0, err
	}); err != nil {
		t.Errorf("%d transactions still recorded once everything was applied: %v", pending, err)
	}
}

// transactionState describes the completeness tables, for a failure.
func transactionState(t *testing.T, st *stack) string {
	t.Helper()
	var out string
	for _, q := range []string{
		`SELECT target || ' ' || coalesce(complete_through::text, 'NULL') FROM scd2sink_watermarks`,
		`SELECT topic || ' ' || coalesce(horizon::text, 'NULL') FROM scd2sink_transaction_horizon`,
		`SELECT topic || '/' || partition || ' next ' || next_offset || ' through ' || coalesce(read_through::text, 'NULL') FROM scd2sink_transaction_reads`,
		`SELECT topic || '/' || partition || ' ' || target || ' caught up ' || coalesce(caught_up_at::text, 'NULL') || ' txn ' || coalesce(transaction_topic, 'NULL') FROM scd2sink_progress`,
		`SELECT t.id || ' ' || t.collection || ' expected ' || t.expected || ' awaited ' || t.awaited || ' at ' || t.commit_at || ' applied ' ||
			(SELECT count(*) FROM scd2sink_transaction_events m WHERE m.id = t.id AND m.collection = t.collection) FROM scd2sink_transactions t ORDER BY t.commit_at LIMIT 10`,
		`SELECT 'marks ' || count(*) FROM scd2sink_transaction_events`,
		`SELECT 'mark ' || id || ' ' || collection || ' ' || total_order FROM scd2sink_transaction_events ORDER BY noted_at LIMIT 5`,
	} {
		rows, err := st.tpool.Query(context.Background(), q)
		if err != nil {
			out += fmt.Sprintf("%s: %v\n", q, err)
			continue
		}
		for rows.Next() {
			var line string
			_ = rows.Scan(&line)
			out += line + "\n"
		}
		rows.Close()
	}
	return out
}
