package app

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"
)

// bankSource is one of the two tables of accounts of TestExactCompleteness.
func bankSource(table string) *scdtest.Source {
	return &scdtest.Source{Server: "bank", DB: "bank", Schema: "public", Table: table, Keys: []string{"id"}, Cols: []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "balance", Schema: `{"type":"int64","optional":false}`},
	}}
}

// lane produces records to one partition in order, each no earlier than
// its due time: a partition whose share of transactions arrives late.
type lane struct {
	ch   chan laneRec
	done chan struct{}
}

type laneRec struct {
	rec *kgo.Record
	due time.Time
}

func newLane(t *testing.T, cl *kgo.Client) *lane {
	l := &lane{ch: make(chan laneRec, 10000), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for r := range l.ch {
			time.Sleep(time.Until(r.due))
			if err := cl.ProduceSync(context.Background(), r.rec).FirstErr(); err != nil {
				t.Error(err)
			}
		}
	}()
	return l
}

// TestExactCompleteness: two tables of accounts and money moved between
// them, each transfer one source transaction whose two updates land on
// different topics and partitions; Debezium's END records on
// bank.transaction count them. One partition's share of 40 transactions
// arrives 3 s after the rest (and after their ENDs), and the service is
// restarted while it is held back. Polled every 50 ms in one snapshot:
// neither table's complete_through ever passes the commit time of a
// transaction whose events are not all applied (every version at or
// before it is there), and the sum over both tables read through the
// _consistent views is always the total (without transaction_topic the
// heuristic passed such a transaction in most polls). Once caught up,
// both are complete through the last commit less the window. Then a
// transaction whose second event is undecodable (dead-lettered) holds the
// watermark until transactions ten minutes newer are applied past it (and
// its END was read a while ago: 3 s here, ten minutes by default): given
// up, it holds it no more.
func TestExactCompleteness(t *testing.T) {
	t.Parallel()
	for _, members := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d members", members), func(t *testing.T) { exactCompleteness(t, members) })
	}
}

// exactCompleteness is TestExactCompleteness with members processes in
// the group.
func exactCompleteness(t *testing.T, members int) {
	chk, sav := bankSource("checking"), bankSource("savings")
	const txnTopic = "bank.transaction"
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, chk.Topic(), sav.Topic()), kfake.SeedTopics(1, txnTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	dsn := pgtest.NewDatabase(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	const window = 100 * time.Millisecond
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 100ms}
sink: {batch_max_wait: 20ms, batch_max_events: 16}
defaults: {transaction_topic: %s}
tables:
  - {topic: %s, target: checking_history}
  - {topic: %s, target: savings_history}
`, brokers, dsn, txnTopic, chk.Topic(), sav.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var cancels []context.CancelFunc
	var dones []chan error
	start := func() {
		mu.Lock()
		defer mu.Unlock()
		for m := 0; m < members; m++ {
			ctx, c := context.WithCancel(context.Background())
			d := make(chan error, 1)
			go func() {
				d <- Run(ctx, cfg, Options{Logger: zaptest.NewLogger(t).Named(fmt.Sprint("member", m)), transactionWait: 3 * time.Second})
			}()
			cancels, dones = append(cancels, c), append(dones, d)
		}
	}
	stop := func() {
		mu.Lock()
		cs, ds := cancels, dones
		cancels, dones = nil, nil
		mu.Unlock()
		for i, c := range cs {
			c()
			if err := <-ds[i]; err != nil {
				t.Errorf("run: %v", err)
			}
		}
	}
	start()
	t.Cleanup(stop)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	// Commits an hour ago, 200 ms apart: the clock never carries the
	// watermark, only what is read and applied.
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	const accounts, transfers, initial = 10, 160, 1000
	commit := func(i int) time.Time { return base.Add(time.Duration(i) * 200 * time.Millisecond) }
	late := newLane(t, cl)
	balance := map[string][]int64{chk.Table: make([]int64, accounts), sav.Table: make([]int64, accounts)}
	lsn := int64(1000)
	// txn writes one source transaction: its events, then its END; the
	// share of checking's partition 0 of transactions 40 to 79 comes 3 s
	// late.
	type ev struct {
		src  *scdtest.Source
		id   int
		op   string
		junk bool // an undecodable record in its place
	}
	txn := func(i int, evs []ev, extra map[string]int64) {
		id := fmt.Sprintf("%d:%d", 500+i, lsn)
		counts := map[string]int64{}
		for n, e := range evs {
			lsn += 8
			counts["public."+e.src.Table]++
			k, v := e.src.Envelope(scdtest.Change{Op: e.op, After: scdtest.Row{"id": e.id, "balance": balance[e.src.Table][e.id]},
				LSN: lsn, TxID: int64(500 + i), Commit: commit(i), Txn: &scdtest.TxnBlock{ID: id, TotalOrder: int64(n + 1), DataCollectionOrder: counts["public."+e.src.Table]}})
			if e.junk {
				v = []byte(`{"schema":null,"payload":{"op":"u","source":`)
			}
			rec := &kgo.Record{Topic: e.src.Topic(), Partition: int32(e.id % 3), Key: k, Value: v}
			if e.src == chk && rec.Partition == 0 && i >= 40 && i < 80 {
				late.ch <- laneRec{rec: rec, due: time.Now().Add(3 * time.Second)}
				continue
			}
			if e.src == chk && rec.Partition == 0 && i >= 80 {
				late.ch <- laneRec{rec: rec, due: time.Now()} // behind the late ones, in order
				continue
			}
			if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
				t.Error(err)
			}
		}
		for n, c := range extra {
			counts[n] += c
		}
		k, v := scdtest.TransactionRecord(id, commit(i), counts)
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: txnTopic, Key: k, Value: v}).FirstErr(); err != nil {
			t.Error(err)
		}
	}
	var opening []ev
	for a := 0; a < accounts; a++ {
		balance[chk.Table][a], balance[sav.Table][a] = initial, initial
		opening = append(opening, ev{src: chk, id: a, op: "c"}, ev{src: sav, id: a, op: "c"})
	}
	const total = 2 * accounts * initial
	// The versions each table has at or before an instant: its opening
	// ones and one per transfer committed by then.
	expected := func(at time.Time) int {
		if at.Before(commit(0)) {
			return 0 // before the accounts opened
		}
		n := accounts
		for i := 1; i <= transfers; i++ {
			if !commit(i).After(at) {
				n++
			}
		}
		return n
	}
	generated := make(chan struct{})
	go func() {
		defer close(generated)
		txn(0, opening, nil)
		for i := 1; i <= transfers; i++ {
			from, to := chk, sav
			if i%2 == 1 {
				from, to = sav, chk
			}
			a, b, amount := i%accounts, (i*7)%accounts, int64(1+i%5)
			balance[from.Table][a] -= amount
			balance[to.Table][b] += amount
			txn(i, []ev{{src: from, id: a, op: "u"}, {src: to, id: b, op: "u"}}, nil)
			time.Sleep(25 * time.Millisecond)
		}
	}()

	polls, seen, bad := 0, 0, 0
	restarted := false
	began := time.Now()
	last := commit(transfers)
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !restarted && time.Since(began) > 1500*time.Millisecond {
			// Restart while the late share is held back (the heuristic,
			// without transaction_topic, then passed it in 29 of 110 polls).
			stop()
			start()
			restarted = true
		}
		polls++
		caught, err := pollCompleteness(pool, expected, last.Add(-window), total, &seen, &bad, t)
		if err != nil {
			continue // the service's tables are not there yet
		}
		if caught == 2 {
			break
		}
	}
	t.Logf("%d polls, %d watermarks read, %d wrong", polls, seen, bad)
	if seen < 20 {
		t.Fatalf("only %d watermarks read in %d polls", seen, polls)
	}
	var w time.Time
	if err := pool.QueryRow(context.Background(), `SELECT min(complete_through) FROM scd2sink_watermarks`).Scan(&w); err != nil || w.Before(last.Add(-window)) {
		var dump []string
		for _, q := range []string{`SELECT topic || ' ' || id || ' ' || collection || ' ' || expected || ' ' || awaited || ' ' || commit_at FROM scd2sink_transactions ORDER BY commit_at LIMIT 5`,
			`SELECT topic || ' ' || id || ' ' || collection || ' ' || total_order FROM scd2sink_transaction_events ORDER BY noted_at LIMIT 5`,
			`SELECT topic || ' ' || partition || ' ' || next_offset || ' ' || coalesce(read_through::text, '-') FROM scd2sink_transaction_reads`} {
			rows, _ := pool.Query(context.Background(), q)
			for rows != nil && rows.Next() {
				var l string
				_ = rows.Scan(&l)
				dump = append(dump, l)
			}
		}
		t.Fatalf("caught up: complete through %s (%v), want %s\n%s", w, err, last.Add(-window), strings.Join(dump, "\n"))
	}

	// A transaction whose second event cannot be read: its END counts two
	// events of checking, one arrives. It holds both tables' watermark.
	<-generated
	close(late.ch)
	<-late.done
	stuck := transfers + 1
	balance[chk.Table][1] -= 5
	balance[chk.Table][2] += 5
	txn(stuck, []ev{{src: chk, id: 1, op: "u"}, {src: chk, id: 2, op: "u", junk: true}}, nil)
	// Ten minutes and more later, one transfer more.
	later := stuck + 10*60*5 + 5
	balance[sav.Table][3] += 1
	balance[sav.Table][4] -= 1
	txn(later, []ev{{src: sav, id: 3, op: "u"}, {src: sav, id: 4, op: "u"}}, nil)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var got *time.Time
		_ = pool.QueryRow(context.Background(), `SELECT scd2sink_consistent_through()`).Scan(&got)
		if got != nil && got.After(commit(stuck)) {
			w = *got
			break
		}
	}
	if !w.After(commit(stuck)) {
		t.Fatalf("the watermark stayed at %s: the transaction missing an event was never given up", w)
	}
	var dead int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM scd2sink_dead_letters`).Scan(&dead); err != nil || dead != 1 {
		t.Errorf("%d dead letters (%v), want the undecodable record", dead, err)
	}
}

// pollCompleteness reads, in one snapshot, each table's complete_through
// and the versions at or before it (expected gives how many were
// committed by then), and the sum of the balances through the consistent
// views; it counts the watermarks seen, the wrong answers, and returns
// how many tables are complete through caughtAt.
func pollCompleteness(pool *pgxpool.Pool, expected func(time.Time) int, caughtAt time.Time, total int64, seen, bad *int, t *testing.T) (int, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	caught := 0
	for _, target := range []string{"checking_history", "savings_history"} {
		var w *time.Time
		if err := tx.QueryRow(ctx, `SELECT complete_through FROM scd2sink_watermarks WHERE target = $1`, target).Scan(&w); err != nil && err != pgx.ErrNoRows {
			return 0, err
		}
		if w == nil {
			continue
		}
		*seen++
		var n int
		if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE valid_from <= $1`, target), *w).Scan(&n); err != nil {
			return 0, err
		}
		if want := expected(*w); n != want {
			*bad++
			t.Errorf("%s complete through %s: %d versions at or before it, %d committed", target, w.Format(time.RFC3339Nano), n, want)
		}
		if !w.Before(caughtAt) {
			caught++
		}
	}
	var at *time.Time
	var sum *int64
	if err := tx.QueryRow(ctx, `SELECT scd2sink_consistent_through(), (SELECT sum(balance) FROM checking_history_consistent) + (SELECT sum(balance) FROM savings_history_consistent)`).Scan(&at, &sum); err != nil {
		return 0, err
	}
	if at != nil && !(sum == nil && expected(*at) == 0) && (sum == nil || *sum != total) {
		*bad++
		t.Errorf("through the consistent views as of %s the accounts sum to %v, not %d", at.Format(time.RFC3339Nano), sum, total)
	}
	return caught, nil
}
