package sink_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestKeyDirectory: in a table partitioned by month whose keys have
// versions closed in every month of a year, a batch of new keys (created,
// changed and given Type 1 changes under all_versions) reads and writes
// none of the partitions of closed versions before its own months, while
// keys deleted before are found through the key directory, re-created,
// and their history is the fold's. A table partitioned by an older
// release (no directory) gets one filled from its rows when opened; erase
// takes a key out of it.
func TestKeyDirectory(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	const schema = "keydir"
	spec := custSpec(schema)
	spec.Type1Scope = sink.AllVersions
	spec.Partitioning = sink.Partitioning{Interval: "month", Ahead: 0}
	c, u, d := change.OpCreate, change.OpUpdate, change.OpDelete
	month := func(m, day int) time.Time { return time.Date(2025, time.Month(m), day, 0, 0, 0, 0, time.UTC) }

	// writer opens a pool of its own, whose backends report their
	// statistics when it is closed (closeWriter).
	writer := func(name string) (*pgxpool.Pool, *sink.Sink) {
		t.Helper()
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = name
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p, newSink(t, p, schema, spec)
	}
	obs := openPool(t, dsn)
	closeWriter := func(p *pgxpool.Pool, name string) {
		t.Helper()
		p.Close()
		for i := 0; ; i++ {
			var n int
			if err := obs.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, name).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
			if i == 200 {
				t.Fatalf("the backends of %s did not exit", name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// scans counts the scans of the partitions of closed versions of
	// February to November 2025.
	scans := func() int64 {
		t.Helper()
		var n int64
		if err := obs.QueryRow(ctx, `SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0)::bigint FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname BETWEEN 'customers_history_p202502' AND 'customers_history_p202511'`, schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// A year: 20 keys, a version a month; five of them deleted in
	// December.
	var evs []*change.Event
	for k := range 20 {
		id := "O" + itoa(k)
		seq := int64(1000 * (k + 1))
		evs = append(evs, cust(c, seq, month(1, 5), id, "name", "n", "plan", "p1", "city", "x", "visits", 1))
		for m := 2; m <= 12; m++ {
			evs = append(evs, cust(u, seq+int64(m), month(m, 5), id, "name", "n", "plan", "p"+itoa(m), "city", "x", "visits", 1))
		}
		if k < 5 {
			evs = append(evs, cust(d, seq+20, month(12, 20), id))
		}
	}
	p1, s1 := writer("keydir-load")
	apply(t, s1, evs...)
	closeWriter(p1, "keydir-load")
	before := scans()

	// New keys, in three batches, and the deleted keys created again.
	p2, s2 := writer("keydir-new")
	var b1, b2, b3 []*change.Event
	for k := range 300 {
		id := "N" + itoa(k)
		seq := int64(100_000 + 100*k)
		b1 = append(b1, cust(c, seq, month(12, 10), id, "name", "n", "plan", "basic", "city", "x", "visits", 1))
		b2 = append(b2, cust(u, seq+10, month(12, 15), id, "name", "n", "plan", "pro", "city", "x", "visits", 2),
			cust(u, seq+20, month(12, 16), id, "name", "n", "plan", "pro", "city", "x", "visits", 3))
		b3 = append(b3, cust(u, seq+30, month(12, 28), id, "name", "m", "plan", "pro", "city", "y", "visits", 4))
		if k%30 == 0 {
			b3 = append(b3, cust(d, seq+40, month(12, 29), id))
		}
	}
	// (Their Type 1 values as before the delete: a change would be
	// written to every version of theirs, in every partition.)
	for k := range 5 {
		b2 = append(b2, cust(c, int64(1000*(k+1)+30), month(12, 25), "O"+itoa(k), "name", "n", "plan", "p13", "city", "x", "visits", 1))
	}
	for _, b := range [][]*change.Event{b1, b2, b3} {
		apply(t, s2, b...)
		evs = append(evs, b...)
	}
	closeWriter(p2, "keydir-new")
	if after := scans(); after != before {
		t.Errorf("new keys scanned the partitions of closed versions before their months %d times", after-before)
	}

	// A restart finds the keys the last batch deleted through the
	// directory, and a late event of one of them is a repair.
	pool := openPool(t, dsn)
	s3 := newSink(t, pool, schema, spec)
	again := []*change.Event{
		cust(c, 100_000+100*30+50, month(12, 30), "N30", "name", "back", "plan", "pro", "city", "y", "visits", 5),
		cust(u, 100_000+100*60+25, month(12, 17), "N60", "name", "late", "plan", "team", "city", "y", "visits", 6),
	}
	apply(t, s3, again...)
	evs = append(evs, again...)
	check := func(when string) {
		t.Helper()
		want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, evs))
		if diff := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); diff != "" {
			t.Fatalf("%s: differs from the fold:\n%s", when, diff)
		}
		verifyClean(t, s3, spec.Target)
	}
	check("after the new keys")
	dirKeys := func() string {
		t.Helper()
		var keys string
		if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(customer_id, ' ' ORDER BY customer_id), '') FROM keydir.customers_history_pdir d
			WHERE NOT EXISTS (SELECT 1 FROM keydir.customers_history_pcur c WHERE c.customer_id = d.customer_id)`).Scan(&keys); err != nil {
			t.Fatal(err)
		}
		return keys
	}
	const closed = "N0 N120 N150 N180 N210 N240 N270 N60 N90"
	if got := dirKeys(); got != closed {
		t.Errorf("keys without a current version in the directory: %q, want %q", got, closed)
	}

	// The table as an older release left it: no directory. Opening it
	// fills one from the rows; the keys are found through it.
	if _, err := pool.Exec(ctx, `DROP TABLE keydir.customers_history_pdir`); err != nil {
		t.Fatal(err)
	}
	if vs, err := s3.Verify(ctx, spec.Target); err != nil || len(vs) != 1 || !strings.Contains(vs[0].Check, "missing key directory") {
		t.Errorf("verify without the directory: %v %v", vs, err)
	}
	s4 := newSinkWith(t, pool, sink.Config{Schema: schema, Tables: []sink.TableSpec{spec}, ErasureSecret: []byte("a test secret of 32 bytes, not less")})
	if got := dirKeys(); got != closed {
		t.Errorf("keys in the directory filled from the table: %q, want %q", got, closed)
	}
	more := []*change.Event{cust(c, 100_000+100*90+50, month(12, 31), "N90", "name", "back", "plan", "pro", "city", "z", "visits", 7)}
	apply(t, s4, more...)
	evs = append(evs, more...)
	check("after the directory was filled")

	if _, err := s4.Erase(ctx, sink.EraseRequest{Target: spec.Target, Keys: [][]string{{"N120"}}, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM keydir.customers_history_pdir WHERE customer_id = 'N120'`).Scan(&left); err != nil || left != 0 {
		t.Errorf("erase left the key in the directory: %d rows (%v)", left, err)
	}
}

// TestKeyDirectoryTruncateElsewhere: writer b knows key K as new, with
// its one version open and no closed one; writer a's batch truncates the
// table, which closes that version into the partitions of closed
// versions. b's next Type 1 change of K (type1_scope: all_versions) must
// reach the closed version there too.
func TestKeyDirectoryTruncateElsewhere(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	const schema = "keytrunc"
	spec := custSpec(schema)
	spec.Type1Scope = sink.AllVersions
	spec.Partitioning = sink.Partitioning{Interval: "month", Ahead: 0}
	at := func(m int) time.Time { return time.Date(2025, time.Month(m), 5, 0, 0, 0, 0, time.UTC) }
	a, b := newSink(t, pool, schema, spec), newSink(t, pool, schema, spec)
	evs := []*change.Event{cust(change.OpCreate, 1, at(1), "K", "name", "first", "plan", "p1", "city", "x", "visits", 1)}
	apply(t, b, evs...)
	trunc := &change.Event{Table: spec.Target, Op: change.OpTruncate, Seq: change.MustSeq(3), ValidFrom: at(3),
		Origin: change.Origin{Partition: change.Partition{Topic: "shop.public.customers"}, Offset: 3}}
	apply(t, a, trunc)
	next := cust(change.OpUpdate, 4, at(4), "K", "name", "second", "plan", "p1", "city", "x", "visits", 2)
	apply(t, b, next)
	evs = append(evs, trunc, next)
	want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, evs))
	if diff := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); diff != "" {
		t.Fatalf("differs from the fold:\n%s", diff)
	}
	verifyClean(t, b, spec.Target)
}
