package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
)

// TestEraseMeetsANewRebuildTable: a rebuild that creates its table while
// an erasure runs, and writes the key into it before the erasure commits,
// is met by the next round, as is a swap's rename (the list is compared
// by oid and name), and a table list that keeps changing ends in an
// error, not a silent success.
func TestEraseMeetsANewRebuildTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	keyFile := filepath.Join(t.TempDir(), "erasure.key")
	if err := os.WriteFile(keyFile, []byte("a secret of thirty-two bytes....\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: [127.0.0.1:1], group_id: live}
postgres: {dsn: %q}
erasure_key_file: %q
tables:
  - {topic: src.cust, target: cust_history, keys: [id]}
`, dsn, keyFile)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	s, err := sink.New(SinkConfig(cfg, zap.NewNop()), pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var evs []*change.Event
	for i, id := range []string{"1", "1", "2"} {
		evs = append(evs, &change.Event{Table: "cust_history", Key: []any{json.Number(id)}, Seq: change.MustSeq(int64(i + 1)), Op: change.OpUpdate,
			ValidFrom: at.Add(time.Duration(i) * time.Hour), After: map[string]any{"id": json.Number(id), "plan": fmt.Sprint("p", i)},
			Origin: change.Origin{Partition: change.Partition{Topic: "src.cust"}, Offset: int64(i)}})
	}
	if _, err := s.Apply(ctx, sink.Batch{Events: evs, Positions: map[change.Partition]sink.Position{
		{Topic: "src.cust"}: {Offset: 3, Target: "cust_history"}}}); err != nil {
		t.Fatal(err)
	}
	// What a rebuild would write of key 1, kept aside.
	if _, err := pool.Exec(ctx, `CREATE TABLE held AS SELECT * FROM cust_history WHERE id::text = '1'`); err != nil {
		t.Fatal(err)
	}
	rebuildWrites := func() {
		if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS cust_history__rebuild (LIKE cust_history);
			INSERT INTO cust_history__rebuild SELECT * FROM held`); err != nil {
			t.Error(err)
		}
	}
	count := func(table string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE id::text = '1'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("a rebuild's table appears after the first round", func(t *testing.T) {
		opts := Options{afterEraseRound: func(round int) {
			if round == 0 {
				rebuildWrites()
			}
		}}
		var out bytes.Buffer
		if err := Erase(ctx, cfg, opts, EraseRequest{Table: "cust_history", Keys: [][]string{{"1"}}, Reason: "test"}, &out); err != nil {
			t.Fatal(err)
		}
		if n, m := count("cust_history"), count("cust_history__rebuild"); n != 0 || m != 0 {
			t.Fatalf("key 1 has %d versions in the live table and %d in the rebuild's after erase", n, m)
		}
	})

	t.Run("tables changing in every round", func(t *testing.T) {
		opts := Options{afterEraseRound: func(round int) {
			if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE cust_history__replaced_%d (LIKE cust_history)`, round)); err != nil {
				t.Error(err)
			}
		}}
		var out bytes.Buffer
		err := Erase(ctx, cfg, opts, EraseRequest{Table: "cust_history", Keys: [][]string{{"2"}}, Reason: "test"}, &out)
		if err == nil {
			t.Fatal("erase succeeded although its tables changed in every round")
		}
		t.Log(err)
	})

	t.Run("a swap renames the tables after the first round", func(t *testing.T) {
		// The swap came between the round's listing and its erasure: the
		// live table it renamed away still holds the key.
		opts := Options{afterEraseRound: func(round int) {
			if round != 0 {
				return
			}
			if _, err := pool.Exec(ctx, `INSERT INTO cust_history OVERRIDING SYSTEM VALUE SELECT * FROM held;
				ALTER TABLE cust_history RENAME TO cust_history__replaced_swap;
				ALTER TABLE cust_history__rebuild RENAME TO cust_history`); err != nil {
				t.Error(err)
			}
		}}
		var out bytes.Buffer
		if err := Erase(ctx, cfg, opts, EraseRequest{Table: "cust_history", Keys: [][]string{{"1"}}, Reason: "test"}, &out); err != nil {
			t.Fatal(err)
		}
		if n := count("cust_history__replaced_swap"); n != 0 {
			t.Fatalf("key 1 has %d versions in the table the swap renamed away", n)
		}
	})
}
