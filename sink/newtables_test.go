package sink_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/scd2sink/scd2sink/sink/catalog"
)

// TestManyNewTablesInNewSchema: a batch that meets a dozen tables for the
// first time, in a schema that does not exist yet, creates them all (their
// DDL runs side by side, the schema once) and applies every one's rows.
// With partitioning, on a pool of four connections (each table's first
// partitions are made in a transaction of its own), the same: nothing
// waits for a connection that a table being made side by side holds.
func TestManyNewTablesInNewSchema(t *testing.T) {
	t.Parallel()
	for _, part := range []sink.Partitioning{{}, {Interval: "month", Ahead: 2}} {
		t.Run("partitioning="+part.Interval, func(t *testing.T) {
			t.Parallel()
			manyNewTables(t, part)
		})
	}
}

func manyNewTables(t *testing.T, part sink.Partitioning) {
	t.Helper()
	pool := openPool(t, withParam(t, pgtest.NewDatabase(t), "pool_max_conns", "4"))
	const n = 12
	var specs []sink.TableSpec
	var evs []*change.Event
	for i := range n {
		target := fmt.Sprintf("t%02d_history", i)
		specs = append(specs, sink.TableSpec{Target: target, Schema: "landing", Keys: []string{"id"}, Partitioning: part})
		for k := range 3 {
			evs = append(evs, &change.Event{Table: target, Key: []any{fmt.Sprint(k)}, Seq: change.MustSeq(int64(k + 1)), Op: change.OpCreate, ValidFrom: day,
				After:  map[string]any{"id": fmt.Sprint(k), "name": fmt.Sprintf("n%d", i)},
				Origin: change.Origin{Partition: change.Partition{Topic: "src." + target}, Offset: int64(k)}})
		}
	}
	s := newSink(t, pool, "public", specs...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a pool waiting on itself fails here, not at the suite's timeout
	defer cancel()
	res, err := s.Apply(ctx, sink.Batch{Events: evs})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if res.VersionsOpened != n*3 {
		t.Errorf("%d versions opened, want %d", res.VersionsOpened, n*3)
	}
	for _, spec := range specs {
		var rows int
		if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM landing.%s WHERE is_current`, spec.Target)).Scan(&rows); err != nil {
			t.Fatalf("%s: %v", spec.Target, err)
		}
		if rows != 3 {
			t.Errorf("%s: %d current versions, want 3", spec.Target, rows)
		}
	}
}

// TestEnsureInNewSchemaSideBySide: sessions that create tables in a schema
// that does not exist yet at the same moment (two instances, or a parked
// table's probe beside a batch) all succeed: the one whose CREATE SCHEMA
// IF NOT EXISTS collides with another's reads the catalog again.
func TestEnsureInNewSchemaSideBySide(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	newSink(t, pool, "public") // the service's tables and functions, in public
	for round := range 3 {
		schema := fmt.Sprintf("side_%d", round)
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Go(func() {
				spec := sink.TableSpec{Target: fmt.Sprintf("t%d_history", i), Schema: schema, ServiceSchema: "public", Keys: []string{"id"}}
				_, errs[i] = catalog.Ensure(context.Background(), pool, spec, []change.Column{{Name: "id", PGType: "bigint"}, {Name: "name", PGType: "text"}})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("%s, table %d: %v", schema, i, err)
			}
		}
	}
}

// TestEnsurePartitionedOnOneConnection: making a partitioned table and its
// first partitions holds one connection at a time: on a pool of one it
// finishes (it waited for a second one, for ever, before).
func TestEnsurePartitionedOnOneConnection(t *testing.T) {
	t.Parallel()
	pool := openPool(t, withParam(t, pgtest.NewDatabase(t), "pool_max_conns", "1"))
	newSink(t, pool, "public")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := sink.TableSpec{Target: "p_history", Schema: "public", ServiceSchema: "public", Keys: []string{"id"},
		Partitioning: sink.Partitioning{Interval: "month", Ahead: 2}}
	tbl, err := catalog.Ensure(ctx, pool, spec, []change.Column{{Name: "id", PGType: "bigint"}, {Name: "name", PGType: "text"}})
	if err != nil {
		t.Fatal(err)
	}
	if tbl.Parts == nil {
		t.Fatal("the table was not made partitioned")
	}
	var parts int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'public.p_history_pold'::regclass`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	if parts < 3 {
		t.Errorf("%d partitions of closed versions, want the current month's and 2 ahead", parts)
	}
}

// withParam sets a parameter of a URL DSN.
func withParam(t *testing.T, dsn, key, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("not a URL DSN: %v", err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}
