package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// dbtSnapshotSQL builds, in schema dbt, the snapshot dbt-core's own test
// (tests/functional/snapshots, new_record mode: seed, invalidate, update,
// then a delete) leaves: 20 customers snapshotted by updated_at; 10..20
// updated an hour later (a new email, and for 20 a first one), their
// first versions closed then; customer 1 deleted at the third run, its
// version closed and a row marked deleted opened (hard_deletes:
// new_record). The facts are dbt's; the SQL is ours.
const dbtSnapshotSQL = `
CREATE SCHEMA dbt;
CREATE TABLE dbt.seed (id integer, first_name varchar(50), last_name varchar(50), email varchar(50), gender varchar(50),
	ip_address varchar(20), updated_at timestamp without time zone);
INSERT INTO dbt.seed VALUES
(1, 'Judith', 'Kennedy', '(not provided)', 'Female', '54.60.24.128', '2015-12-24 12:19:28'),
(2, 'Arthur', 'Kelly', '(not provided)', 'Male', '62.56.24.215', '2015-10-28 16:22:15'),
(3, 'Rachel', 'Moreno', 'rmoreno2@msu.edu', 'Female', '31.222.249.23', '2016-04-05 02:05:30'),
(4, 'Ralph', 'Turner', 'rturner3@hp.com', 'Male', '157.83.76.114', '2016-08-08 00:06:51'),
(5, 'Laura', 'Gonzales', 'lgonzales4@howstuffworks.com', 'Female', '30.54.105.168', '2016-09-01 08:25:38'),
(6, 'Katherine', 'Lopez', 'klopez5@yahoo.co.jp', 'Female', '169.138.46.89', '2016-08-30 18:52:11'),
(7, 'Jeremy', 'Hamilton', 'jhamilton6@mozilla.org', 'Male', '231.189.13.133', '2016-07-17 02:09:46'),
(8, 'Heather', 'Rose', 'hrose7@goodreads.com', 'Female', '87.165.201.65', '2015-12-29 22:03:56'),
(9, 'Gregory', 'Kelly', 'gkelly8@trellian.com', 'Male', '154.209.99.7', '2016-03-24 21:18:16'),
(10, 'Rachel', 'Lopez', 'rlopez9@themeforest.net', 'Female', '237.165.82.71', '2016-08-20 15:44:49'),
(11, 'Donna', 'Welch', 'dwelcha@shutterfly.com', 'Female', '103.33.110.138', '2016-02-27 01:41:48'),
(12, 'Russell', 'Lawrence', 'rlawrenceb@qq.com', 'Male', '189.115.73.4', '2016-06-11 03:07:09'),
(13, 'Michelle', 'Montgomery', 'mmontgomeryc@scientificamerican.com', 'Female', '243.220.95.82', '2016-06-18 16:27:19'),
(14, 'Walter', 'Castillo', 'wcastillod@pagesperso-orange.fr', 'Male', '71.159.238.196', '2016-10-06 01:55:44'),
(15, 'Robin', 'Mills', 'rmillse@vkontakte.ru', 'Female', '172.190.5.50', '2016-10-31 11:41:21'),
(16, 'Raymond', 'Holmes', 'rholmesf@usgs.gov', 'Male', '148.153.166.95', '2016-10-03 08:16:38'),
(17, 'Gary', 'Bishop', 'gbishopg@plala.or.jp', 'Male', '161.108.182.13', '2016-08-29 19:35:20'),
(18, 'Anna', 'Riley', 'arileyh@nasa.gov', 'Female', '253.31.108.22', '2015-12-11 04:34:27'),
(19, 'Sarah', 'Knight', 'sknighti@foxnews.com', 'Female', '222.220.3.177', '2016-09-26 00:49:06'),
(20, 'Phyllis', 'Fox', null, 'Female', '163.191.232.95', '2016-08-21 10:35:19');
CREATE TABLE dbt.snapshot_actual (id integer, first_name varchar(50), last_name varchar(50), email varchar(50), gender varchar(50),
	ip_address varchar(20), updated_at timestamp without time zone, dbt_valid_from timestamp without time zone,
	dbt_valid_to timestamp without time zone, dbt_scd_id text, dbt_updated_at timestamp without time zone, dbt_is_deleted text);
-- The first snapshot.
INSERT INTO dbt.snapshot_actual SELECT id, first_name, last_name, email, gender, ip_address, updated_at,
	updated_at, NULL, md5(id || '-' || first_name || '|' || updated_at::text), updated_at, 'False' FROM dbt.seed;
-- Invalidate: 10..20 change an hour later.
UPDATE dbt.seed SET updated_at = updated_at + interval '1 hour',
	email = CASE WHEN id = 20 THEN 'pfoxj@creativecommons.org' ELSE 'new_' || email END WHERE id BETWEEN 10 AND 20;
UPDATE dbt.snapshot_actual SET dbt_valid_to = updated_at + interval '1 hour' WHERE id BETWEEN 10 AND 20;
INSERT INTO dbt.snapshot_actual SELECT id, first_name, last_name, email, gender, ip_address, updated_at,
	updated_at, NULL, md5(id || '-' || first_name || '|' || updated_at::text), updated_at, 'False' FROM dbt.seed WHERE id BETWEEN 10 AND 20;
-- Customer 1 is deleted; the third run (at 2017-01-01) closes its version and opens one marked deleted.
DELETE FROM dbt.seed WHERE id = 1;
UPDATE dbt.snapshot_actual SET dbt_valid_to = '2017-01-01' WHERE id = 1 AND dbt_valid_to IS NULL;
INSERT INTO dbt.snapshot_actual SELECT id, first_name, last_name, email, gender, ip_address, updated_at,
	'2017-01-01', NULL, md5(id || '-deleted'), '2017-01-01', 'True' FROM dbt.snapshot_actual WHERE id = 1;
`

// TestImportDBTSnapshot: `scd2sink import --layout dbt` of the snapshot
// dbt-core's tests build (seed, invalidate, update, a hard delete under
// hard_deletes: new_record) into a target with deletes: new_record: the
// dry run writes nothing; the history equals the dbt snapshot row for row
// (values, valid_from, valid_to, deleted); a second import changes
// nothing (no version opened, every scd_id kept); Debezium's snapshot of
// the same rows that follows opens no version, and a later update does;
// a rebuild from a topic holding only Debezium's records keeps every
// imported version.
func TestImportDBTSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, dbtSnapshotSQL); err != nil {
		t.Fatal(err)
	}
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"}, Cols: []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "first_name", Schema: `{"type":"string","optional":true}`},
		{Name: "last_name", Schema: `{"type":"string","optional":true}`},
		{Name: "email", Schema: `{"type":"string","optional":true}`},
		{Name: "gender", Schema: `{"type":"string","optional":true}`},
		{Name: "ip_address", Schema: `{"type":"string","optional":true}`},
		{Name: "updated_at", Schema: `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1}`},
	}}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, src.Topic()), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, group_id: live, session_timeout: 2s}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 20ms}
sink: {batch_max_events: 300, batch_max_wait: 10ms}
tables:
  - {topic: %s, target: customers_history, keys: [id], deletes: new_record}
`, brokers, dsn, src.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	importAs := func(q ImportQuery) (string, error) {
		t.Helper()
		var out bytes.Buffer
		err := Import(ctx, cfg, Options{}, q, &out)
		return out.String(), err
	}
	dbt := ImportQuery{Table: "customers_history", From: "dbt.snapshot_actual", Layout: "dbt"}

	// A dry run: what it would write, and nothing written.
	dry := dbt
	dry.DryRun = true
	out, err := importAs(dry)
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if !strings.Contains(out, "would import dbt.snapshot_actual into customers_history: 20 keys, 31 versions, 1 deletes; no invalid version") {
		t.Errorf("dry run said:\n%s", out)
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('customers_history') IS NOT NULL").Scan(&exists); err != nil || exists {
		t.Fatalf("the dry run created customers_history (%v)", err)
	}

	// The history equals dbt's snapshot, row for row.
	sameAsDBT := func(when string) {
		t.Helper()
		var diff string
		if err := pool.QueryRow(ctx, `WITH h AS (
				SELECT id, first_name, last_name, email, gender, ip_address, updated_at, valid_from, valid_to, scd_deleted FROM customers_history),
			d AS (SELECT id, first_name, last_name, email, gender, ip_address, updated_at, dbt_valid_from AT TIME ZONE 'UTC',
				dbt_valid_to AT TIME ZONE 'UTC', dbt_is_deleted = 'True' FROM dbt.snapshot_actual)
			SELECT coalesce(string_agg(x, E'\n'), '') FROM (
				(SELECT 'only in the history: ' || h::text AS x FROM (SELECT * FROM h EXCEPT SELECT * FROM d) h)
				UNION ALL (SELECT 'only in dbt: ' || d::text FROM (SELECT * FROM d EXCEPT SELECT * FROM h) d)) y`).Scan(&diff); err != nil {
			t.Fatal(err)
		}
		if diff != "" {
			t.Fatalf("%s: the history differs from dbt's snapshot:\n%s", when, diff)
		}
	}
	ids := func() map[string]int64 {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT id || '@' || valid_from, scd_id FROM customers_history`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]int64{}
		for rows.Next() {
			var k string
			var id int64
			if err := rows.Scan(&k, &id); err != nil {
				t.Fatal(err)
			}
			out[k] = id
		}
		return out
	}
	out, err = importAs(dbt)
	if err != nil {
		t.Fatalf("import: %v\n%s", err, out)
	}
	sameAsDBT("after the import")
	var report strings.Builder
	if n, err := Verify(ctx, cfg, &report); err != nil || n != 0 {
		t.Fatalf("verify after the import: %d violations (%v)\n%s", n, err, report.String())
	}
	before := ids()

	// Again: nothing changes.
	out, err = importAs(dbt)
	if err != nil || !strings.Contains(out, "0 versions opened, 32 events already there, 0 dead letters") {
		t.Fatalf("a second import: %v\n%s", err, out)
	}
	sameAsDBT("after a second import")
	if after := ids(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a second import changed the scd_ids:\n%v\n%v", before, after)
	}

	// Debezium's snapshot of the source as it is now (customer 1 gone):
	// the same values, so no version opens; then a real change does.
	rows, err := pool.Query(ctx, `SELECT id, first_name, last_name, email, gender, ip_address, (extract(epoch FROM updated_at) * 1000000)::bigint FROM dbt.seed ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	lsn := int64(1000)
	for rows.Next() {
		var id int32
		var first, last, email, gender, ip *string
		var updated int64
		if err := rows.Scan(&id, &first, &last, &email, &gender, &ip, &updated); err != nil {
			t.Fatal(err)
		}
		snap := "true"
		if id == 20 {
			snap = "last"
		}
		row := scdtest.Row{"id": id, "first_name": first, "last_name": last, "email": email, "gender": gender, "ip_address": ip, "updated_at": updated}
		k, v := src.Envelope(scdtest.Change{Op: "r", After: row, LSN: lsn, Commit: at, Snapshot: snap})
		recs = append(recs, &kgo.Record{Topic: src.Topic(), Key: k, Value: v})
		lsn += 10
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	produce := func(recs []*kgo.Record) {
		t.Helper()
		cl := mustClient(t, kafka)
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	runUntil := func(n int64) {
		t.Helper()
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- Run(rctx, cfg, Options{}) }()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var got int64
			_ = pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE consumer_group = 'live'").Scan(&got)
			if got >= n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run applied %d of %d records", got, n)
			}
			time.Sleep(50 * time.Millisecond)
		}
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	produce(recs)
	runUntil(int64(len(recs)))
	sameAsDBT("after Debezium's snapshot of the same rows")
	var update []*kgo.Record
	k, v := src.Envelope(scdtest.Change{Op: "u", After: scdtest.Row{"id": 5, "first_name": "Laura", "last_name": "Gonzales", "email": "laura@example.com",
		"gender": "Female", "ip_address": "30.54.105.168", "updated_at": time.Date(2016, 9, 1, 8, 25, 38, 0, time.UTC).UnixMicro()}, LSN: 5000, Commit: at.Add(time.Hour)})
	update = append(update, &kgo.Record{Topic: src.Topic(), Key: k, Value: v})
	produce(update)
	runUntil(int64(len(recs) + 1))
	var five string
	if err := pool.QueryRow(ctx, `SELECT string_agg(coalesce(email, '∅') || ':' || (valid_to IS NULL), ' ' ORDER BY valid_from) FROM customers_history WHERE id = 5`).Scan(&five); err != nil ||
		five != "lgonzales4@howstuffworks.com:false laura@example.com:true" {
		t.Fatalf("customer 5 after an update: %s (%v)", five, err)
	}

	// A dbt version that starts after Debezium's first event of its key
	// in the target would be folded before it: refused, and listed.
	if _, err := pool.Exec(ctx, `INSERT INTO dbt.snapshot_actual SELECT id, first_name, last_name, email, gender, ip_address, updated_at,
		'2026-12-02', NULL, 'late', '2026-12-02', 'False' FROM dbt.snapshot_actual WHERE id = 3`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE dbt.snapshot_actual SET dbt_valid_to = '2026-12-02' WHERE id = 3 AND dbt_scd_id <> 'late'`); err != nil {
		t.Fatal(err)
	}
	out, err = importAs(dbt)
	if !errors.Is(err, ErrInvalidImport) || !strings.Contains(out, "3\t2016-04-05 02:05:30+00\t2026-12-02 00:00:00+00\treaches into the key's history from the source") ||
		!strings.Contains(out, "3\t2026-12-02 00:00:00+00\tNULL\treaches into") {
		t.Fatalf("an import reaching into Debezium's history: %v\n%s", err, out)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM dbt.snapshot_actual WHERE dbt_scd_id = 'late'; UPDATE dbt.snapshot_actual SET dbt_valid_to = NULL WHERE id = 3`); err != nil {
		t.Fatal(err)
	}

	// A rebuild from a topic holding only Debezium's records keeps every
	// imported version, with its scd_id.
	before = ids()
	if err := Rebuild(ctx, cfg, Options{}, RebuildMode{}); err != nil {
		t.Fatal(err)
	}
	if after := ids(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the rebuild changed the versions or their scd_ids:\n%v\n%v", before, after)
	}
}

// TestImportRefusesInvalid: a table of another layout (--valid-from,
// --valid-to) with overlapping versions, a valid_to before its
// valid_from and two versions of a key at one time: the dry run lists
// every one, and import refuses the table and writes nothing. Fixed, it
// imports: a gap between versions and a last version closed are deletes
// at their ends.
func TestImportRefusesInvalid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA legacy;
		CREATE TABLE legacy.plans_scd (account text, plan text, seats integer, row_start timestamptz, row_end timestamptz, etl_batch integer);
		INSERT INTO legacy.plans_scd VALUES
			('a', 'free', 1, '2020-01-01', '2021-01-01', 1), ('a', 'pro', 5, '2021-01-01', NULL, 2),
			('b', 'free', 1, '2020-01-01', '2020-06-01', 1), ('b', 'team', 9, '2020-03-01', NULL, 2),  -- overlap
			('c', 'pro', 2, '2020-05-01', '2020-04-01', 1),                                            -- inverted
			('d', 'free', 1, '2020-01-01', '2020-02-01', 1), ('d', 'pro', 1, '2020-01-01', NULL, 2),   -- one time
			('e', 'free', 1, '2020-01-01', '2020-02-01', 1), ('e', 'pro', 3, '2020-03-01', '2020-04-01', 2),
			('f', 'free', 1, '2020-01-01', '2020-01-01', 1),                                           -- empty
			('g', 'free', 1, '2020-01-01', '2999-01-01', 1)                                            -- a future end`); err != nil {
		t.Fatal(err)
	}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "src.plans"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: ""}
tables:
  - {topic: src.plans, target: plans_history, keys: [account], ignore_columns: [etl_batch]}
`, brokers, dsn)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	q := ImportQuery{Table: "plans_history", From: "legacy.plans_scd", ValidFrom: "row_start", ValidTo: "row_end"}
	for _, dry := range []bool{true, false} {
		q.DryRun = dry
		var out bytes.Buffer
		err := Import(ctx, cfg, Options{}, q, &out)
		if !errors.Is(err, ErrInvalidImport) {
			t.Fatalf("dry run %v: %v; want it refused\n%s", dry, err, out.String())
		}
		for _, want := range []string{"5 invalid versions", "b\t2020-03-01 00:00:00+00\tNULL\toverlaps the previous version of the key",
			"c\t2020-05-01 00:00:00+00\t2020-04-01 00:00:00+00\tvalid_to is not after valid_from", "d\t2020-01-01 00:00:00+00\tNULL\ttwo versions of the key at one valid_from",
			"f\t2020-01-01 00:00:00+00\t2020-01-01 00:00:00+00\tvalid_to is not after valid_from", "g\t2020-01-01 00:00:00+00\t2999-01-01 00:00:00+00\ta time in the future"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("dry run %v: the listing lacks %q:\n%s", dry, want, out.String())
			}
		}
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('plans_history') IS NOT NULL").Scan(&exists); err != nil || exists {
		t.Fatalf("a refused import created plans_history (%v)", err)
	}
	// Without etl_batch in ignore_columns, a column the target lacks is
	// an error naming it, once the target exists.
	if _, err := pool.Exec(ctx, `DELETE FROM legacy.plans_scd WHERE account IN ('b', 'c', 'd', 'f', 'g')`); err != nil {
		t.Fatal(err)
	}
	q.DryRun = false
	var out bytes.Buffer
	if err := Import(ctx, cfg, Options{}, q, &out); err != nil {
		t.Fatalf("import of the fixed table: %v\n%s", err, out.String())
	}
	var hist string
	if err := pool.QueryRow(ctx, `SELECT string_agg(account || ':' || plan || ':' || seats || ':' || to_char(valid_from AT TIME ZONE 'UTC', 'YYYY-MM-DD') || '..' ||
		coalesce(to_char(valid_to AT TIME ZONE 'UTC', 'YYYY-MM-DD'), ''), ' ' ORDER BY account, valid_from) FROM plans_history`).Scan(&hist); err != nil {
		t.Fatal(err)
	}
	if want := "a:free:1:2020-01-01..2021-01-01 a:pro:5:2021-01-01.. e:free:1:2020-01-01..2020-02-01 e:pro:3:2020-03-01..2020-04-01"; hist != want {
		t.Errorf("plans_history:\n got %s\nwant %s", hist, want)
	}
	cfg.Tables[0].IgnoreColumns = nil
	out.Reset()
	if err := Import(ctx, cfg, Options{}, q, &out); err == nil || !strings.Contains(err.Error(), "etl_batch") {
		t.Errorf("a column the target lacks: %v; want an error naming etl_batch", err)
	}
}

// TestImportBesideRun: an import of years of history runs while run
// applies Debezium's snapshot and changes of the same keys (import takes
// the writers' locks, one chunk at a time): the history is the imported
// versions followed by Debezium's, every key's, and verify passes.
func TestImportBesideRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const keys = 3000
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA legacy;
		CREATE TABLE legacy.accounts_scd AS
		SELECT k AS account_id, 'p' || v AS plan, v AS seats,
			timestamptz '2020-01-01' + v * interval '100 days' AS row_start,
			timestamptz '2020-01-01' + (v + 1) * interval '100 days' AS row_end
		FROM generate_series(1, %d) k, generate_series(0, 2) v`, keys)); err != nil {
		t.Fatal(err)
	}
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "accounts", Keys: []string{"account_id"}, Cols: []scdtest.Col{
		{Name: "account_id", Schema: `{"type":"int32","optional":false}`},
		{Name: "plan", Schema: `{"type":"string","optional":true}`},
		{Name: "seats", Schema: `{"type":"int32","optional":true}`},
	}}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, src.Topic()), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, group_id: live, session_timeout: 2s}
postgres: {dsn: %q}
http: {addr: ""}
sequencer: {reorder_window: 20ms}
sink: {batch_max_events: 200, batch_max_wait: 10ms}
tables:
  - {topic: %s, target: accounts_history, keys: [account_id]}
`, brokers, dsn, src.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, cfg, Options{}) }()
	// Debezium's snapshot in 2026, then a change of every third key,
	// produced while the import runs.
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	cl := mustClient(t, kafka)
	produced := make(chan error, 1)
	total := 0
	var recs []*kgo.Record
	for k := 1; k <= keys; k++ {
		key, v := src.Envelope(scdtest.Change{Op: "r", After: scdtest.Row{"account_id": k, "plan": "p2", "seats": 2}, LSN: int64(1000 + k), Commit: at, Snapshot: "true"})
		recs = append(recs, &kgo.Record{Topic: src.Topic(), Key: key, Value: v})
		if k%3 == 0 {
			key, v := src.Envelope(scdtest.Change{Op: "u", After: scdtest.Row{"account_id": k, "plan": "p9", "seats": 9}, LSN: int64(100000 + k), Commit: at.Add(time.Hour)})
			recs = append(recs, &kgo.Record{Topic: src.Topic(), Key: key, Value: v})
		}
	}
	total = len(recs)
	go func() {
		for len(recs) > 0 {
			n := min(len(recs), 200)
			if err := cl.ProduceSync(ctx, recs[:n]...).FirstErr(); err != nil {
				produced <- err
				return
			}
			recs = recs[n:]
			time.Sleep(20 * time.Millisecond)
		}
		produced <- nil
	}()
	// The import starts once run has applied some of the snapshot: those
	// keys' imported versions are late events for them, the others'
	// Debezium events come after the import's.
	applied := func() (n int64) {
		_ = pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE consumer_group = 'live'").Scan(&n)
		return n
	}
	for wait := time.Now().Add(30 * time.Second); applied() < 400 && time.Now().Before(wait); {
		time.Sleep(10 * time.Millisecond)
	}
	before := applied()
	var out bytes.Buffer
	if err := Import(ctx, cfg, Options{}, ImportQuery{Table: "accounts_history", From: "legacy.accounts_scd", ValidFrom: "row_start", ValidTo: "row_end"}, &out); err != nil {
		t.Fatalf("import beside run: %v\n%s", err, out.String())
	}
	if before < 400 || before >= int64(total) {
		t.Fatalf("run had applied %d of %d records when the import started: not beside it", before, total)
	}
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int64
		_ = pool.QueryRow(ctx, "SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE consumer_group = 'live'").Scan(&n)
		if n >= int64(total) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run applied %d of %d records", n, total)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Imported: p0, p1, p2 closed at 2020-10-27 (a delete at its end);
	// Debezium's snapshot opens p2 again in 2026; every third key then p9.
	var bad int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT account_id, string_agg(plan || ':' || coalesce(to_char(valid_to AT TIME ZONE 'UTC', 'YYYY-MM-DD'), '-'), ' ' ORDER BY valid_from) AS h
		FROM accounts_history GROUP BY account_id) x
		WHERE h <> CASE WHEN account_id % 3 = 0 THEN 'p0:2020-04-10 p1:2020-07-19 p2:2020-10-27 p2:2026-11-01 p9:-'
			ELSE 'p0:2020-04-10 p1:2020-07-19 p2:2020-10-27 p2:-' END`).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	var keysSeen int64
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT account_id) FROM accounts_history`).Scan(&keysSeen); err != nil || bad != 0 || keysSeen != keys {
		t.Fatalf("%d of %d keys with another history than imported + Debezium's (%v)", bad, keysSeen, err)
	}
	var report strings.Builder
	if n, err := Verify(ctx, cfg, &report); err != nil || n != 0 {
		t.Fatalf("verify: %d violations (%v)\n%s", n, err, report.String())
	}
	t.Logf("%s", out.String())
}
