package consumer_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// TestOneTableTroubleStaysInItsTable: tables fed a steady stream of
// Debezium changes while one table is locked ACCESS EXCLUSIVE for 25 s
// (and, with twenty tables, another has a column renamed by hand and a
// third its INSERT privilege revoked from the service's role, both put
// right after 10 s): every other table's lag stays within its normal
// bound throughout, the troubled tables are parked (metric, /readyz) and
// catch up by themselves once the cause is gone, and every history ends
// exactly as the changes say.
func TestOneTableTroubleStaysInItsTable(t *testing.T) {
	if testing.Short() {
		t.Skip("35 s of traffic per case")
	}
	for _, n := range []int{2, 20} {
		t.Run(fmt.Sprintf("%d tables", n), func(t *testing.T) { parkScenario(t, n) })
	}
}

func parkScenario(t *testing.T, n int) {
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	admin, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	// The service's own role: it owns what it creates, and a grant can be
	// taken from it.
	u, _ := url.Parse(dsn)
	db := strings.TrimPrefix(u.Path, "/")
	role := fmt.Sprintf("svc_%d_%d", os.Getpid(), n)
	for _, q := range []string{
		fmt.Sprintf(`DROP ROLE IF EXISTS %s`, role),
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'pw'`, role),
		fmt.Sprintf(`CREATE SCHEMA hist AUTHORIZATION %s`, role),
		fmt.Sprintf(`GRANT CREATE, CONNECT ON DATABASE %s TO %s`, pgx.Identifier{db}.Sanitize(), role),
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS hist CASCADE`)
		_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %s`, role))
		_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP ROLE IF EXISTS %s`, role))
	})
	u.User = url.UserPassword(role, "pw")
	pc, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	lockTimeout := time.Second
	if n == 2 {
		// The locked table's source gains a column: its DDL waits for
		// the lock in preparing, which a 2 s wait on the poll loop per
		// probe would show in the healthy table's lag.
		lockTimeout = 2 * time.Second
	}
	pc.ConnConfig.RuntimeParams["lock_timeout"] = fmt.Sprint(lockTimeout.Milliseconds())
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	var specs []sink.TableSpec
	var topics []string
	for i := 0; i < n; i++ {
		spec := sink.TableSpec{Target: fmt.Sprintf("t%02d_history", i), Schema: "hist", Keys: []string{"id"}, TrackHistory: []string{"plan"},
			Type1Scope: sink.AllVersions, Deletes: sink.DeletesClose}
		specs = append(specs, spec)
		topics = append(topics, topicOf(spec.Target))
	}
	kafka := newKafka(t, 1, topics...)
	var evolved atomic.Bool // t00's source has a column more (2 tables)
	src := func(i int) *scdtest.Source {
		s := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: fmt.Sprintf("t%02d", i), Keys: []string{"id"},
			Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "plan", Schema: `{"type":"string","optional":true}`},
				{Name: "note", Schema: `{"type":"string","optional":true}`}}}
		if i == 0 && evolved.Load() {
			s.Cols = append(s.Cols, scdtest.Col{Name: "extra", Schema: `{"type":"string","optional":true}`})
		}
		return s
	}
	s, err := sink.New(sink.Config{Schema: "hist", Tables: specs, ConsumerGroup: "g"}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	m := consumer.NewMetrics(nil)
	health := &consumer.Health{}
	c, err := consumer.New(consumer.Config{Brokers: kafka.ListenAddrs(), GroupID: "g", ClientID: "test", StartOffset: "earliest",
		Rules: rulesFor(specs), ReorderWindow: 50 * time.Millisecond, MaxBufferedEvents: 100000, BatchMaxEvents: 500,
		BatchMaxWait: 20 * time.Millisecond, Metrics: m, Logger: testLogger(t)}, s, health)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx, 30*time.Second) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()

	// The stream: every 100 ms one change per table, to one of 5 keys,
	// each a new plan (so each opens a version).
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	type sent struct {
		id   int
		plan string
		at   time.Time // its commit time
	}
	var mu sync.Mutex
	produced := make([][]time.Time, n) // per table, per offset: when produced
	history := make([][]sent, n)
	base := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	stop := make(chan struct{})
	var prodWG sync.WaitGroup
	prodWG.Add(1)
	go func() {
		defer prodWG.Done()
		for step := 0; ; step++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			var recs []*kgo.Record
			for i := 0; i < n; i++ {
				id, plan, at := step%5, fmt.Sprintf("p%d", step), base.Add(time.Duration(step)*time.Second)
				op := "u"
				if step < 5 {
					op = "c"
				}
				k, v := src(i).Envelope(scdtest.Change{Op: op, After: scdtest.Row{"id": id, "plan": plan, "note": "n", "extra": "x"}, LSN: int64(1000 + step), TxID: int64(step), Commit: at})
				recs = append(recs, &kgo.Record{Topic: topics[i], Key: k, Value: v})
				mu.Lock()
				history[i] = append(history[i], sent{id, plan, at})
				mu.Unlock()
			}
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				t.Errorf("producing: %v", err)
				return
			}
			now := time.Now()
			mu.Lock()
			for i := range produced {
				produced[i] = append(produced[i], now)
			}
			mu.Unlock()
		}
	}()
	applied := func() map[string]int64 {
		out := map[string]int64{}
		rows, err := admin.Query(ctx, `SELECT topic, next_offset FROM hist.scd2sink_offsets`)
		if err != nil {
			return out
		}
		defer rows.Close()
		for rows.Next() {
			var topic string
			var o int64
			if rows.Scan(&topic, &o) == nil {
				out[topic] = o
			}
		}
		return out
	}
	// Wait for the tables to exist and be applied, then make trouble.
	tables := func() int {
		var k int
		_ = admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'hist' AND tablename ~ '^t[0-9]+_history$'`).Scan(&k)
		return k
	}
	deadline := time.Now().Add(30 * time.Second)
	for (len(applied()) < n || tables() < n) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if got, made := len(applied()), tables(); got < n || made < n {
		t.Fatalf("%d of %d tables applied (%d created) before the trouble", got, n, made)
	}
	troubled := map[int]bool{0: true}
	lockConn, err := admin.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := lockConn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE hist.t00_history IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	lockedAt := time.Now()
	evolved.Store(n == 2)
	unlocked := make(chan struct{})
	go func() {
		defer close(unlocked)
		time.Sleep(25 * time.Second)
		_ = tx.Rollback(ctx)
		lockConn.Release()
	}()
	if n >= 20 {
		troubled[7], troubled[13] = true, true
		for _, q := range []string{`ALTER TABLE hist.t07_history RENAME COLUMN note TO note_by_hand`,
			fmt.Sprintf(`REVOKE INSERT ON hist.t13_history FROM %s`, role)} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		go func() {
			time.Sleep(10 * time.Second)
			for _, q := range []string{`ALTER TABLE hist.t07_history RENAME COLUMN note_by_hand TO note`,
				fmt.Sprintf(`GRANT INSERT ON hist.t13_history TO %s`, role)} {
				if _, err := admin.Exec(context.Background(), q); err != nil {
					t.Errorf("%s: %v", q, err)
				}
			}
		}()
	}
	// Sample the healthy tables' lag: how long the oldest record not yet
	// applied has waited.
	var worst time.Duration
	var worstTable string
	parkedSeen := map[int]bool{}
	var readyz string
	// Stalls: the times a healthy table's lag rose past 3/4 of
	// lock_timeout. The first failure costs one (the batch that meets it
	// waits lock_timeout); a parked table's probes must cost none more. A
	// stall ends once the lag has stayed below for a second: the lag of
	// one stall, sampled every 200 ms, may dip under the line between two
	// tables' batches (a loaded machine counted one stall twice), while
	// the probes come 10 s apart.
	var stallsAt []time.Duration
	stalled := false
	var lowSince time.Time
	for time.Since(lockedAt) < 27*time.Second {
		time.Sleep(200 * time.Millisecond)
		ap := applied()
		now := time.Now()
		high := false
		mu.Lock()
		for i := 0; i < n; i++ {
			if troubled[i] {
				if testutil.ToFloat64(m.TargetBlocked.WithLabelValues(specs[i].Target)) == 1 {
					parkedSeen[i] = true
					if why := health.Waiting(); !health.Ready() && strings.Contains(why, specs[i].Target) {
						readyz = why
					}
				}
				continue
			}
			if o := ap[topics[i]]; o < int64(len(produced[i])) {
				lag := now.Sub(produced[i][o])
				if lag > worst {
					worst, worstTable = lag, specs[i].Target
				}
				high = high || lag > lockTimeout*3/4
			}
		}
		mu.Unlock()
		switch {
		case high && !stalled:
			stallsAt = append(stallsAt, now.Sub(lockedAt).Round(100*time.Millisecond))
			stalled, lowSince = true, time.Time{}
		case high:
			lowSince = time.Time{}
		case stalled && lowSince.IsZero():
			lowSince = now
		case stalled && now.Sub(lowSince) >= time.Second:
			stalled = false
		}
	}
	stalls := len(stallsAt)
	close(stop)
	prodWG.Wait()
	<-unlocked
	t.Logf("%d tables: the healthy tables' worst lag was %s (%s)", n, worst.Round(time.Millisecond), worstTable)
	if worst > 3*time.Second {
		t.Errorf("a healthy table lagged %s (%s) while another was in trouble; want within the normal bound (3 s)", worst, worstTable)
	}
	t.Logf("%d stalls of the healthy tables past %s, at %v after the lock", stalls, lockTimeout*3/4, stallsAt)
	if stalls > 1 {
		t.Errorf("the healthy tables stalled %d times past %s (at %v): the parked table's probes hold them up", stalls, lockTimeout*3/4, stallsAt)
	}
	for i := range troubled {
		if !parkedSeen[i] {
			t.Errorf("%s was never shown parked (scd2sink_target_blocked)", specs[i].Target)
		}
	}
	if readyz == "" {
		t.Errorf("/readyz never named a parked target")
	} else {
		t.Logf("/readyz while parked: %s", readyz)
	}
	// Everything catches up, the troubled tables too, and each history
	// is exactly what the changes say.
	mu.Lock()
	total := int64(len(produced[0]))
	mu.Unlock()
	deadline = time.Now().Add(60 * time.Second)
	for {
		ap, all := applied(), true
		for _, topic := range topics {
			all = all && ap[topic] >= total
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every table caught up within 60 s after the trouble: %v (want %d each)", ap, total)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < n; i++ {
		var want []string
		byKey := map[int][]sent{}
		for _, e := range history[i] {
			byKey[e.id] = append(byKey[e.id], e)
		}
		for id := 0; id < 5; id++ {
			vs := byKey[id]
			for j, v := range vs {
				to := "-"
				if j+1 < len(vs) {
					to = vs[j+1].at.Format("150405")
				}
				want = append(want, fmt.Sprintf("%d %s %s %s", id, v.plan, v.at.Format("150405"), to))
			}
		}
		var got []string
		rows, err := admin.Query(ctx, fmt.Sprintf(`SELECT id || ' ' || plan || ' ' || to_char(valid_from AT TIME ZONE 'UTC', 'HH24MISS') || ' ' ||
			coalesce(to_char(valid_to AT TIME ZONE 'UTC', 'HH24MISS'), '-') FROM hist.%s ORDER BY id, valid_from`, specs[i].Target))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var l string
			if err := rows.Scan(&l); err != nil {
				t.Fatal(err)
			}
			got = append(got, l)
		}
		rows.Close()
		if d := scdtest.DiffLines(want, got); d != "" {
			t.Errorf("%s differs from what the changes say:\n%s", specs[i].Target, d)
		}
	}
	// The parking ends on the poll loop's next pass after the probe that
	// applied committed: shortly after the offsets show it.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		why := health.Waiting()
		if !strings.Contains(why, "parked") {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("still parked 5 s after catching up: %s", why)
			break
		}
	}
}

// testLogger logs to the test's output with PARK_DEBUG set.
func testLogger(t *testing.T) *zap.Logger {
	if os.Getenv("PARK_DEBUG") == "" {
		return zap.NewNop()
	}
	return zaptest.NewLogger(t)
}
