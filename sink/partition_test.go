package sink_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/retry"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestPartitionedProperty is TestFoldPropertyParallel over history tables
// partitioned by day: the same history as the fold (late events, re-opens
// in repairs, truncates, deletes as rows), partitions created by the
// writers side by side as versions close into new days, every closed
// version in its day's partition and every current one in _pcur.
func TestPartitionedProperty(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	for seed := uint64(1); seed <= uint64(max(1, propertySeeds(t)/6)); seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			runScenario(t, pool, seed, scenarioOpts{parts: 3, interval: "day", tune: splitAll})
			schema := fmt.Sprintf("part%d", seed)
			for _, target := range []string{"acct_history", "item_history"} {
				var misplaced, parts int
				if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT
					count(*) FILTER (WHERE (valid_to IS NULL) <> (tableoid = '%[1]s.%[2]s_pcur'::regclass)
						OR (valid_to IS NOT NULL AND tableoid::regclass::text <> '%[1]s.%[2]s_p' || to_char(valid_to AT TIME ZONE 'UTC', 'YYYYMMDD'))),
					(SELECT count(*) FROM pg_inherits WHERE inhparent = '%[1]s.%[2]s_pold'::regclass)
					FROM %[1]s.%[2]s`, schema, target)).Scan(&misplaced, &parts); err != nil {
					t.Fatal(err)
				}
				if misplaced != 0 || parts < 2 {
					t.Errorf("%s: %d versions in the wrong partition, %d partitions of closed versions", target, misplaced, parts)
				}
			}
		})
	}
}

// TestPartitionedRetention: retention over a table partitioned by month
// removes what it removes from a plain one, then drops the partitions of
// closed versions that end before the horizon; _as_of, verify and later
// events work on what is left, and a new month's partition is created by
// the batch that first closes a version into it.
func TestPartitionedRetention(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	const schema = "part_ret"
	spec := custSpec(schema)
	spec.Retention, spec.Partitioning = 60*24*time.Hour, sink.Partitioning{Interval: "month", Ahead: 0}
	s := newSink(t, pool, schema, spec)
	c, u := change.OpCreate, change.OpUpdate
	month := func(m int) time.Time { return time.Date(2025, time.Month(m), 10, 0, 0, 0, 0, time.UTC) }
	var evs []*change.Event
	for k := range 4 {
		id := "K" + itoa(k)
		seq := int64(100 * k)
		evs = append(evs, cust(c, seq+1, month(1), id, "name", "n", "plan", "p1", "city", "x", "visits", 1))
		for m := 2; m <= 8; m++ {
			evs = append(evs, cust(u, seq+int64(m), month(m), id, "name", "n", "plan", "p"+itoa(m), "city", "x", "visits", 1))
		}
	}
	// A key deleted in February: in the key directory until retention
	// removes its one version.
	evs = append(evs, cust(c, 900, month(1), "gone", "name", "n", "plan", "p1", "city", "x", "visits", 1),
		cust(change.OpDelete, 901, month(2), "gone"))
	apply(t, s, evs...)
	inDir := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM part_ret.customers_history_pdir WHERE customer_id = 'gone'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if inDir() != 1 {
		t.Fatal("the deleted key is not in the key directory")
	}
	var parts string
	listParts := func() string {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT string_agg(c.relname, ' ' ORDER BY c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = 'part_ret.customers_history_pold'::regclass`).Scan(&parts); err != nil {
			t.Fatal(err)
		}
		return parts
	}
	if got := listParts(); !strings.Contains(got, "customers_history_p202502") || !strings.Contains(got, "customers_history_p202508") {
		t.Fatalf("partitions after the load: %s", got)
	}
	now := time.Date(2025, 10, 1, 0, 0, 0, 0, time.UTC)
	if err := s.Watermark(ctx, map[change.Partition]sink.Look{{Topic: "cust", Partition: 0}: {Target: spec.Target, At: &now}}); err != nil {
		t.Fatal(err)
	}
	// An analyst's long query holds February's partition: its DETACH
	// cannot get the lock, and it waits for the next pass without
	// failing this one (DESIGN.md section 12).
	reader, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Exec(ctx, "SELECT count(*) FROM part_ret.customers_history_p202502"); err != nil {
		t.Fatal(err)
	}
	res, err := s.Retain(ctx, spec.Target, now, nil)
	_ = reader.Rollback(ctx)
	if err != nil {
		t.Fatalf("a pass with a partition locked by a reader: %v", err)
	}
	if res.Partitions != 5 || res.PartitionsWaiting != 1 || res.Versions != 25 || !strings.Contains(listParts(), "customers_history_p202502") {
		t.Errorf("retention with February's partition held: %+v; partitions %s", res, listParts())
	}
	next, err := s.Retain(ctx, spec.Target, now, nil)
	if err != nil || next.Partitions != 1 || next.PartitionsWaiting != 0 {
		t.Errorf("the next pass, the reader gone: %+v %v", next, err)
	}
	horizon := now.Add(-spec.Retention) // 2025-08-02: closed in February..July goes
	if inDir() != 0 {
		t.Error("retention removed every version of the deleted key, but not its row of the key directory")
	}
	if got := listParts(); strings.Contains(got, "customers_history_p202507") || !strings.Contains(got, "customers_history_p202508") {
		t.Errorf("partitions after retention: %s", got)
	}
	want := scdtest.ModelLines(spec, custCols, scdtest.Retained(scdtest.Fold(spec, custCols, evs), horizon))
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
		t.Fatalf("differs from the retained fold:\n%s", d)
	}
	verifyClean(t, s, spec.Target)
	var asOf int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM part_ret.customers_history_as_of('2025-08-15')`).Scan(&asOf); err != nil || asOf != 4 {
		t.Errorf("_as_of in August: %d rows (%v)", asOf, err)
	}
	// A change in November closes the current versions into a month that
	// has no partition yet.
	var more []*change.Event
	for k := range 4 {
		more = append(more, cust(u, int64(100*k+50), time.Date(2025, 11, 3, 0, 0, 0, 0, time.UTC), "K"+itoa(k), "name", "n", "plan", "nov", "city", "x", "visits", 1))
	}
	apply(t, s, more...)
	if got := listParts(); !strings.Contains(got, "customers_history_p202511") {
		t.Errorf("no November partition: %s", got)
	}
	want = scdtest.ModelLines(spec, custCols, scdtest.Retained(scdtest.Fold(spec, custCols, append(evs, more...)), horizon))
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
		t.Fatalf("after November: differs from the retained fold:\n%s", d)
	}
	verifyClean(t, s, spec.Target)

	// The partition of this month (created ahead, remembered by s) is
	// dropped behind s's back, as another instance's retention could:
	// a version closing into it finds none: the try fails with a
	// transient error, and the next one (the consumer's retry) reads the
	// catalog again and creates it; nothing becomes a dead letter.
	this := time.Now().UTC().Truncate(time.Second)
	name := "part_ret.customers_history_p" + this.Format("200601")
	if _, err := pool.Exec(ctx, "ALTER TABLE part_ret.customers_history_pold DETACH PARTITION "+name+"; DROP TABLE "+name); err != nil {
		t.Fatal(err)
	}
	late := cust(u, 170, this, "K1", "name", "n", "plan", "now", "city", "x", "visits", 1)
	var r sink.Result
	tries, err := retry.Policy{Classify: sink.Classify, Tries: 3, Backoff: time.Millisecond}.Do(ctx, func(ctx context.Context) (err error) {
		r, err = s.Apply(ctx, sink.Batch{Events: []*change.Event{late}})
		return err
	})
	if err != nil || len(r.Dead) != 0 || tries != 1 {
		t.Fatalf("a version closing into a dropped partition: %+v %v (%d retries, want 1)", r, err, tries)
	}
	want = scdtest.ModelLines(spec, custCols, scdtest.Retained(scdtest.Fold(spec, custCols, append(append(evs, more...), late)), horizon))
	if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
		t.Fatalf("after this month: differs from the retained fold:\n%s", d)
	}
}

// TestPartitionedVerifyDuplicateID: a partitioned table's scd_id index
// includes the partition keys, so one scd_id in two partitions (a row
// copied by hand) is not refused: verify reports it.
func TestPartitionedVerifyDuplicateID(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	const schema = "part_dup"
	spec := custSpec(schema)
	spec.Partitioning = sink.Partitioning{Interval: "month"}
	s := newSink(t, pool, schema, spec)
	at := time.Date(2025, 3, 10, 0, 0, 0, 0, time.UTC)
	apply(t, s, cust(change.OpCreate, 1, at, "K", "name", "n", "plan", "a", "city", "x", "visits", 1),
		cust(change.OpUpdate, 2, at.Add(24*time.Hour), "K", "name", "n", "plan", "b", "city", "x", "visits", 1))
	verifyClean(t, s, spec.Target)
	// The closed version, again, as a current version of another key.
	if _, err := pool.Exec(ctx, `INSERT INTO part_dup.customers_history OVERRIDING SYSTEM VALUE
		SELECT (r).* FROM (SELECT h AS r FROM part_dup.customers_history h WHERE NOT is_current) x`); err == nil {
		t.Fatal("a copy of a version with the same key and sequence was accepted")
	}
	if _, err := pool.Exec(ctx, `INSERT INTO part_dup.customers_history (scd_id, customer_id, name, plan, city, visits, valid_from, valid_to, is_current, scd_seq, scd_op, scd_hash)
		OVERRIDING SYSTEM VALUE SELECT scd_id, 'K2', name, plan, city, visits, valid_from, NULL, true, scd_seq, scd_op, scd_hash
		FROM part_dup.customers_history WHERE NOT is_current`); err != nil {
		t.Fatal(err)
	}
	vs, err := s.Verify(ctx, spec.Target)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 1 || vs[0].Check != "duplicate scd_id" {
		t.Fatalf("verify: %v; want one duplicate scd_id", vs)
	}
}
