package sink_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink"
)

var (
	sharedOnce sync.Once
	sharedDSN  string
)

// sharedPool returns a pool on a database that tests share, each in its own
// schema; it is cheaper than a database per scenario.
func sharedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	sharedOnce.Do(func() { sharedDSN = pgtest.NewDatabase(&onceT{T: t}) })
	return openPool(t, sharedDSN)
}

// onceT keeps the shared database alive past the test that created it.
type onceT struct{ *testing.T }

func (o *onceT) Cleanup(func()) {}

func openPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return openPool(t, pgtest.NewDatabase(t))
}

func newSink(t *testing.T, pool *pgxpool.Pool, schema string, specs ...sink.TableSpec) *sink.Sink {
	t.Helper()
	return newSinkWith(t, pool, sink.Config{Schema: schema, Tables: specs})
}

func newSinkWith(t *testing.T, pool *pgxpool.Pool, cfg sink.Config) *sink.Sink {
	t.Helper()
	return newSinkTuned(t, pool, cfg, nil)
}

// newSinkTuned is newSinkWith with the sink's tuning changed by tune.
func newSinkTuned(t *testing.T, pool *pgxpool.Pool, cfg sink.Config, tune func(*sink.Tuning)) *sink.Sink {
	t.Helper()
	s, err := sink.NewTuned(cfg, pool, tune)
	if err != nil {
		t.Fatalf("sink.New: %v", err)
	}
	if err := s.Init(context.Background()); err != nil {
		t.Fatalf("sink.Init: %v", err)
	}
	return s
}

// splitAll applies every batch that may be split in parts (parallel.go).
func splitAll(tu *sink.Tuning) { tu.MinSplitEvents = 1 }

func apply(t *testing.T, s *sink.Sink, evs ...*change.Event) sink.Result {
	t.Helper()
	res, err := s.Apply(context.Background(), sink.Batch{Events: evs})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return res
}

func verifyClean(t *testing.T, s *sink.Sink, target string) {
	t.Helper()
	vs, err := s.Verify(context.Background(), target)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	for _, v := range vs {
		t.Errorf("violation: %s", v)
	}
}

func newBenchDSN(b *testing.B) string {
	b.Helper()
	return pgtest.NewDatabase(b)
}

// emptySchema deletes every row of every table in schema (history, side,
// repair and the service's tables), keeping the tables: a test that runs
// case after case in one schema then creates its tables once, not once
// per case (their DDL is most of such a test's time). The service's
// tables hold no rows the sink's Init needs, and the sequences start
// again: a new Sink on the emptied schema starts as on a new one.
func emptySchema(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT c.oid::regclass::text, c.relkind = 'S' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'S')`, schema)
	if err != nil {
		t.Fatal(err)
	}
	type rel struct {
		Name string
		Seq  bool
	}
	rels, err := pgx.CollectRows(rows, pgx.RowToStructByPos[rel])
	if err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	for _, r := range rels {
		if r.Seq {
			b.Queue("SELECT setval($1::regclass, 1, false)", r.Name) // scd_id starts again at 1
		} else {
			b.Queue("DELETE FROM " + r.Name)
		}
	}
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatalf("emptying schema %s: %v", schema, err)
	}
}
