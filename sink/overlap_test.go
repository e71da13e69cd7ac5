package sink_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/scd2sink/scd2sink/sink/catalog"
)

// TestNoOverlapConstraint: history_constraint: no_overlap on a database
// without btree_gist waits with an error naming the table and the
// extension (blocked, never half added); on a table whose versions
// overlap already it lists them and adds nothing; once mended it adds a
// deferred exclusion constraint, after which PostgreSQL itself refuses an
// overlapping version written by hand, while the service's late repairs
// commit.
func TestNoOverlapConstraint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	spec := sink.TableSpec{Target: "acct_history", Keys: []string{"id"},
		Columns: []catalog.Column{{Name: "id", Type: "bigint"}, {Name: "plan", Type: "text"}}}
	day := func(d int) time.Time { return time.Date(2026, 1, d, 0, 0, 0, 0, time.UTC) }
	event := func(seq int, d int, plan string) *change.Event {
		return &change.Event{Table: "acct_history", Op: change.OpUpdate, Key: []any{int64(7)}, KeyNames: []string{"id"},
			After: map[string]any{"id": int64(7), "plan": plan}, ValidFrom: day(d), Seq: change.MustSeq(seq)}
	}
	apply(t, newSink(t, pool, "public", spec), event(10, 1, "a"), event(30, 30, "b"))
	// Another tool makes two versions overlap.
	if _, err := pool.Exec(ctx, `UPDATE acct_history SET valid_to = $1 WHERE plan = 'a'`, day(40)); err != nil {
		t.Fatal(err)
	}

	spec.NoOverlap = true
	initErr := func() error {
		s, err := sink.New(sink.Config{Schema: "public", Tables: []sink.TableSpec{spec}}, pool)
		if err != nil {
			t.Fatal(err)
		}
		return s.Init(ctx)
	}
	err := initErr()
	var ce *catalog.ConstraintError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "btree_gist") || !strings.Contains(err.Error(), "acct_history") || sink.Classify(err) != sink.Blocked {
		t.Fatalf("without btree_gist: %v (%v), want a blocked error naming the table and the extension", err, sink.Classify(err))
	}
	if _, err := pool.Exec(ctx, "CREATE EXTENSION btree_gist"); err != nil {
		t.Fatal(err)
	}
	err = initErr()
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), `key [7]`) || !strings.Contains(err.Error(), "overlaps") {
		t.Fatalf("with overlapping versions: %v, want them listed", err)
	}
	if _, err := pool.Exec(ctx, `UPDATE acct_history SET valid_to = $1 WHERE plan = 'a'`, day(30)); err != nil {
		t.Fatal(err)
	}
	s := newSink(t, pool, "public", spec) // once mended, Init adds it
	var deferred bool
	if err := pool.QueryRow(ctx, `SELECT condeferred FROM pg_constraint WHERE conname = 'acct_history_scd_excl' AND contype = 'x'`).Scan(&deferred); err != nil || !deferred {
		t.Fatalf("constraint: deferred %v, %v", deferred, err)
	}
	// PostgreSQL refuses an overlapping version written by hand.
	_, err = pool.Exec(ctx, `INSERT INTO acct_history (id, plan, valid_from, valid_to, is_current, scd_seq, scd_op, scd_hash)
		SELECT 7, 'x', $1, $2, false, scd_seq || '\x00'::bytea, 'u', scd_hash FROM acct_history WHERE plan = 'a'`, day(15), day(16))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23P01" {
		t.Fatalf("an overlapping version by hand: %v, want 23P01", err)
	}
	// verify names the constraint when it goes missing.
	if _, err := pool.Exec(ctx, `ALTER TABLE acct_history DROP CONSTRAINT acct_history_scd_excl`); err != nil {
		t.Fatal(err)
	}
	vs, err := s.Verify(ctx, "acct_history")
	if err != nil || len(vs) != 1 || !strings.Contains(vs[0].Check, "no-overlap constraint acct_history_scd_excl") {
		t.Fatalf("verify without the constraint: %v, %v", vs, err)
	}
	s = newSink(t, pool, "public", spec) // and a start adds it again
	// The service's own late event repairs the history and commits.
	apply(t, s, event(20, 20, "late"))
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM acct_history WHERE id = 7`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("after the late event: %d versions (%v), want 3", n, err)
	}
	verifyClean(t, s, "acct_history")
}

// TestOverlapRefusedParksOneTable: when what the service writes overlaps
// a version another tool wrote behind its back (the state it remembers
// is stale), the constraint refuses it within the batch: the failure is
// that table's, one the consumer parks (blocked, never a dead letter),
// not the whole batch's at COMMIT.
func TestOverlapRefusedParksOneTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	if _, err := pool.Exec(ctx, "CREATE EXTENSION btree_gist"); err != nil {
		t.Fatal(err)
	}
	cols := []catalog.Column{{Name: "id", Type: "bigint"}, {Name: "plan", Type: "text"}}
	guarded := sink.TableSpec{Target: "acct_history", Keys: []string{"id"}, NoOverlap: true, Columns: cols}
	plain := sink.TableSpec{Target: "other_history", Keys: []string{"id"}, Columns: cols}
	s := newSink(t, pool, "public", guarded, plain)
	day := func(d int) time.Time { return time.Date(2026, 1, d, 0, 0, 0, 0, time.UTC) }
	ev := func(table string, seq, d int, op change.Op, plan string) *change.Event {
		return &change.Event{Table: table, Op: op, Key: []any{int64(9)}, KeyNames: []string{"id"},
			After: map[string]any{"id": int64(9), "plan": plan}, ValidFrom: day(d), Seq: change.MustSeq(seq)}
	}
	apply(t, s, ev("acct_history", 10, 1, change.OpCreate, "a"), ev("other_history", 10, 1, change.OpCreate, "a"))
	// Another tool closes the version and opens its own, behind the
	// service's back: no overlap, so PostgreSQL lets it.
	if _, err := pool.Exec(ctx, `WITH closed AS (UPDATE acct_history SET valid_to = $1, is_current = false WHERE id = 9 RETURNING scd_seq, scd_hash)
		INSERT INTO acct_history (id, plan, valid_from, is_current, scd_seq, scd_op, scd_hash)
		SELECT 9, 'foreign', $1, true, scd_seq || '\x01'::bytea, 'u', scd_hash FROM closed`, day(5)); err != nil {
		t.Fatal(err)
	}
	_, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{ev("acct_history", 20, 10, change.OpUpdate, "b"), ev("other_history", 20, 10, change.OpUpdate, "b")}})
	target, park := sink.ParkTarget(err)
	if !park || target != "acct_history" || sink.Classify(err) != sink.Blocked {
		t.Fatalf("Apply: %v (park %v %q, %v), want acct_history parked as blocked", err, park, target, sink.Classify(err))
	}
	if strings.Contains(sink.Summary(err), "foreign") || !strings.Contains(sink.Summary(err), "23P01") {
		t.Errorf("summary %q", sink.Summary(err))
	}
	var dead int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_dead_letters`).Scan(&dead)
	if dead != 0 {
		t.Errorf("%d dead letters: the refusal is no event's fault", dead)
	}
}
