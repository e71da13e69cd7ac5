//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// sourceDB is the source PostgreSQL: logical decoding for Debezium, commit
// timestamps for the ground truth.
type sourceDB struct {
	cluster *pgtest.Cluster
	port    int
	db, dsn string
	pool    *pgxpool.Pool
}

// auditSchema adds the ground truth to the sample schema
// (deploy/source-init.sql, which docker-compose.yml uses too): every row
// change, independent of Debezium.
const auditSchema = `
DROP TABLE IF EXISTS audit_log;
CREATE TABLE audit_log (id bigserial PRIMARY KEY, tbl text NOT NULL, op char(1) NOT NULL, old jsonb, new jsonb);
CREATE OR REPLACE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO audit_log (tbl, op, old, new) VALUES (TG_TABLE_NAME, left(TG_OP, 1),
		CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END, CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END);
	RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER customers_audit AFTER INSERT OR UPDATE OR DELETE ON customers FOR EACH ROW EXECUTE FUNCTION audit();
CREATE OR REPLACE TRIGGER accounts_audit AFTER INSERT OR UPDATE OR DELETE ON accounts FOR EACH ROW EXECUTE FUNCTION audit();
`

// firstID is where the workload's keys start: above the sample workload of
// docker-compose.yml, so that with E2E_TARGET=compose the checks compare
// only rows whose whole life the audit log saw.
const firstID = 1_000_000

// srcTable is a source table and its history table.
type srcTable struct {
	name string
	spec sink.TableSpec // as scd2sink is configured for it
	cols []string       // the columns after the key
}

// tables are the captured tables: customers with the default replica
// identity, accounts with REPLICA IDENTITY FULL.
var tables = []srcTable{
	{"customers", sink.TableSpec{Target: "customers_history", Schema: "public", Keys: []string{"id"},
		TrackHistory: []string{"plan", "city", "balance"}},
		[]string{"name", "plan", "city", "balance", "birth", "updated_at", "attrs", "ext", "bio"}},
	{"accounts", sink.TableSpec{Target: "accounts_history", Schema: "public", Keys: []string{"id"},
		TrackHistory: []string{"tier", "limit_amount"}},
		[]string{"owner", "tier", "limit_amount", "opened", "note"}},
}

func startSource(t *testing.T, ctx context.Context) sourceDB {
	t.Helper()
	c, err := pgtest.StartLocal(ctx, "wal_level=logical", "max_replication_slots=4", "max_wal_senders=4", "track_commit_timestamp=on")
	if err != nil {
		t.Fatalf("source PostgreSQL: %v", err)
	}
	t.Cleanup(c.Stop)
	dsn, err := c.CreateDatabase(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(dsn)
	port, _ := strconv.Atoi(u.Port())
	pool := utcPool(t, dsn)
	sample, err := os.ReadFile("../deploy/source-init.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, string(sample)); err != nil {
		t.Fatalf("source schema: %v", err)
	}
	src := sourceDB{cluster: c, port: port, db: "shop", dsn: dsn, pool: pool}
	src.audit(t, ctx)
	return src
}

// audit installs the ground truth's trigger (anew: the log starts empty).
func (s sourceDB) audit(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := s.pool.Exec(ctx, auditSchema); err != nil {
		t.Fatalf("audit trigger: %v", err)
	}
}

// utcPool opens a pool whose sessions print times in UTC.
func utcPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["timezone"] = "UTC"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// workload changes customers the way applications do: a transaction of
// hundreds of rows, tracked and untracked updates, no-op updates, deletes,
// re-inserts of deleted keys and a primary-key change.
type workload struct {
	rng      *rand.Rand
	live     map[int]bool
	gone     []int
	next     int
	accounts map[int]bool
	nextAcct int
}

func newWorkload(seed uint64) *workload {
	return &workload{rng: rand.New(rand.NewPCG(seed, 7)), live: map[int]bool{}, next: firstID, accounts: map[int]bool{}, nextAcct: firstID}
}

// account changes accounts: inserts, tracked and untracked updates, an
// append to the TOASTed note, deletes.
func (w *workload) account(ctx context.Context, tx pgx.Tx) error {
	var ids []int
	for id := range w.accounts {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	r := w.rng.IntN(100)
	if len(ids) < 5 || r < 25 {
		id := w.nextAcct
		w.nextAcct++
		w.accounts[id] = true
		_, err := tx.Exec(ctx, `INSERT INTO accounts VALUES ($1, $2, $3, $4::numeric / 1000, date '1960-01-01' + $5::int, $6)`,
			id, fmt.Sprintf("owner %d", id), plans[w.rng.IntN(4)], w.rng.IntN(10000000), w.rng.IntN(25000),
			strings.Repeat(fmt.Sprintf("note %d %x ", id, w.rng.Uint64()), 150))
		return err
	}
	id := ids[w.rng.IntN(len(ids))]
	var err error
	switch {
	case r < 50:
		_, err = tx.Exec(ctx, `UPDATE accounts SET tier = $2, limit_amount = limit_amount * 2 WHERE id = $1`, id, plans[w.rng.IntN(4)])
	case r < 70:
		_, err = tx.Exec(ctx, `UPDATE accounts SET owner = owner || '+' WHERE id = $1`, id)
	case r < 85:
		_, err = tx.Exec(ctx, `UPDATE accounts SET note = note || '.' WHERE id = $1`, id)
	default:
		delete(w.accounts, id)
		_, err = tx.Exec(ctx, `DELETE FROM accounts WHERE id = $1`, id)
	}
	return err
}

var plans = []string{"basic", "pro", "team", "enterprise"}
var cities = []string{"Wien", "Linz", "Graz", "Salzburg", "Innsbruck"}

func (w *workload) insert(ctx context.Context, tx pgx.Tx, id int) error {
	bio := strings.Repeat(fmt.Sprintf("%d likes long walks and %x. ", id, w.rng.Uint64()), 80) // ~3.5 KB: TOASTed
	_, err := tx.Exec(ctx, `INSERT INTO customers VALUES ($1, $2, $3, $4, $5::numeric / 100, date '1950-01-01' + $6::int,
		timestamptz '2026-01-01 00:00:00+00' + $7 * interval '1 microsecond', $8::jsonb, gen_random_uuid(), $9)`,
		id, fmt.Sprintf("Customer %d", id), plans[w.rng.IntN(4)], cities[w.rng.IntN(5)], w.rng.IntN(2000000)-1000000,
		w.rng.IntN(30000), w.rng.Int64N(1e12), fmt.Sprintf(`{"tier": %d, "big": 12345678901234567890, "x": 1.10, "s": "q\"uote"}`, w.rng.IntN(5)), bio)
	w.live[id] = true
	return err
}

func (w *workload) anyLive() int {
	ids := make([]int, 0, len(w.live))
	for id := range w.live {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids[w.rng.IntN(len(ids))]
}

// run applies the workload: one big transaction, then n small ones.
func (w *workload) run(ctx context.Context, pool *pgxpool.Pool, bulk, n int) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := 0; i < bulk; i++ {
			if err := w.insert(ctx, tx, w.next); err != nil {
				return err
			}
			w.next++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("bulk insert: %w", err)
	}
	pkChanged := false
	for i := 0; i < n; i++ {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if w.rng.IntN(3) == 0 {
				if err := w.account(ctx, tx); err != nil {
					return err
				}
			}
			id := w.anyLive()
			var q string
			var args []any
			switch r := w.rng.IntN(100); {
			case r < 30:
				q, args = `UPDATE customers SET plan = $2, balance = balance + 0.01 WHERE id = $1`, []any{id, plans[w.rng.IntN(4)]}
			case r < 45:
				q, args = `UPDATE customers SET city = $2 WHERE id = $1`, []any{id, cities[w.rng.IntN(5)]}
			case r < 65:
				q, args = `UPDATE customers SET name = name || '.', attrs = attrs || jsonb_build_object('n', $2::int), updated_at = updated_at + interval '1 second' WHERE id = $1`, []any{id, i}
			case r < 72:
				q, args = `UPDATE customers SET plan = plan WHERE id = $1`, []any{id}
			case r < 82 && len(w.live) > 10:
				delete(w.live, id)
				w.gone = append(w.gone, id)
				q, args = `DELETE FROM customers WHERE id = $1`, []any{id}
			case r < 92 && len(w.gone) > 0:
				back := w.gone[0]
				w.gone = w.gone[1:]
				return w.insert(ctx, tx, back)
			case !pkChanged:
				pkChanged = true
				delete(w.live, id)
				w.live[id+100000] = true
				q, args = `UPDATE customers SET id = id + 100000, plan = 'moved' WHERE id = $1`, []any{id}
			default:
				q, args = `UPDATE customers SET bio = bio || '!' WHERE id = $1`, []any{id}
			}
			_, err := tx.Exec(ctx, q, args...)
			return err
		})
		if err != nil {
			return fmt.Errorf("change %d: %w", i, err)
		}
	}
	return nil
}

// truth folds the audit log into the expected history lines, with the
// reference model of DESIGN.md section 5: events in commit order, the
// commit time (milliseconds, as Debezium's source.ts_ms) as valid time, a
// primary-key change as a delete of the old key and a create of the new.
func truth(t *testing.T, ctx context.Context, src sourceDB, tb srcTable) []string {
	t.Helper()
	historyCols, historySpec := tb.cols, tb.spec
	sel := func(alias string) string {
		var parts []string
		for _, c := range append([]string{"id"}, historyCols...) {
			parts = append(parts, fmt.Sprintf("(%s).%s::text", alias, c))
		}
		return strings.Join(parts, ", ")
	}
	rows, err := src.pool.Query(ctx, fmt.Sprintf(`SELECT a.op, date_trunc('milliseconds', pg_xact_commit_timestamp(a.xmin)), %[1]s, %[2]s
		FROM audit_log a,
			LATERAL (SELECT jsonb_populate_record(NULL::%[3]s, a.old) AS o, jsonb_populate_record(NULL::%[3]s, a.new) AS n) r
		WHERE a.tbl = $1
		ORDER BY pg_xact_commit_timestamp(a.xmin), a.id`, sel("r.o"), sel("r.n"), tb.name), tb.name)
	if err != nil {
		t.Fatalf("reading the audit log: %v", err)
	}
	defer rows.Close()
	n := len(historyCols) + 1
	var evs []*change.Event
	seq := int64(0)
	for rows.Next() {
		var op string
		var at time.Time
		vals := make([]*string, 2*n)
		dest := []any{&op, &at}
		for i := range vals {
			dest = append(dest, &vals[i])
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		image := func(off int) map[string]any {
			m := map[string]any{}
			for i, c := range append([]string{"id"}, historyCols...) {
				if v := vals[off+i]; v != nil {
					m[c] = *v
				} else {
					m[c] = nil
				}
			}
			return m
		}
		add := func(o change.Op, row map[string]any, key any) {
			seq++
			ev := &change.Event{Table: historySpec.Target, Key: []any{key}, Seq: change.MustSeq(seq), Op: o, ValidFrom: at}
			if o.HasAfter() {
				ev.After = row
			}
			evs = append(evs, ev)
		}
		switch op {
		case "I":
			add(change.OpCreate, image(n), *vals[n])
		case "U":
			if *vals[0] != *vals[n] { // a primary-key change
				add(change.OpDelete, nil, *vals[0])
				add(change.OpCreate, image(n), *vals[n])
			} else {
				add(change.OpUpdate, image(n), *vals[n])
			}
		case "D":
			add(change.OpDelete, nil, *vals[0])
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return stripSeq(scdtest.ModelLines(historySpec, historyCols, scdtest.Fold(historySpec, historyCols, evs)))
}

// stripSeq drops the seq= field: the model numbers events in commit order,
// scd2sink keeps Debezium's LSNs.
func stripSeq(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		if a := strings.Index(l, " seq="); a >= 0 {
			if b := strings.Index(l[a+1:], " "); b >= 0 {
				l = l[:a] + l[a+1+b:]
			}
		}
		out[i] = l
	}
	sort.Strings(out)
	return out
}
