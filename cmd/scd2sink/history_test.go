package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestHistoryCommand runs `scd2sink history` (the built binary) on a
// history table holding two keys of a composite key.
func TestHistoryCommand(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	spec := sink.TableSpec{Target: "orders_history", Keys: []string{"shop", "order_id"}, TrackHistory: []string{"status"}}
	s, err := sink.New(sink.Config{Tables: []sink.TableSpec{spec}}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(ctx); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	ev := func(seq int64, shop, id, status string, op change.Op) *change.Event {
		e := &change.Event{Table: "orders_history", Key: []any{shop, id}, Seq: change.MustSeq(seq), Op: op,
			ValidFrom: day.Add(time.Duration(seq) * 24 * time.Hour)}
		if op != change.OpDelete {
			e.After = map[string]any{"shop": shop, "order_id": id, "status": status, "note": nil}
		}
		return e
	}
	if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{
		ev(1, "1", "A-9", "new", change.OpCreate), ev(2, "1", "A-9", "paid", change.OpUpdate),
		ev(3, "1", "A-9", "", change.OpDelete), ev(4, "2", "A-9", "new", change.OpCreate),
	}}); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "scd2sink.yaml")
	yaml := fmt.Sprintf("kafka: {brokers: [\"127.0.0.1:1\"]}\npostgres: {dsn: %q}\ntables:\n  - {topic: shop.public.orders, target: orders_history, keys: [shop, order_id], track_history: [status]}\n", dsn)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string
		code  int
		lines []string // expected stdout lines, spaces squeezed
		err   string
	}{
		{"all versions", []string{"--table", "orders_history", "--key", "1,A-9"}, 0, []string{
			"shop order_id note status valid_from (UTC) valid_to (UTC) is_current",
			"1 A-9 NULL new 2026-03-02 00:00:00.000000 2026-03-03 00:00:00.000000 false",
			"1 A-9 NULL paid 2026-03-03 00:00:00.000000 2026-03-04 00:00:00.000000 false",
		}, ""},
		{"by topic, at a time", []string{"--table", "shop.public.orders", "--key", "1,A-9", "--at", "2026-03-03T12:00:00Z"}, 0, []string{
			"shop order_id note status valid_from (UTC) valid_to (UTC) is_current",
			"1 A-9 NULL paid 2026-03-03 00:00:00.000000 2026-03-04 00:00:00.000000 false",
		}, ""},
		{"current", []string{"--table", "orders_history", "--key", "2,A-9", "--at", "2030-01-01"}, 0, []string{
			"shop order_id note status valid_from (UTC) valid_to (UTC) is_current",
			"2 A-9 NULL new 2026-03-05 00:00:00.000000 true",
		}, ""},
		{"nothing valid then", []string{"--table", "orders_history", "--key", "1,A-9", "--at", "2026-03-10"}, 1, nil, "no version valid at 2026-03-10"},
		{"unknown key", []string{"--table", "orders_history", "--key", "9,X"}, 1, nil, "no versions"},
		{"unknown table", []string{"--table", "nope", "--key", "1"}, 2, nil, "--table"},
		{"wrong key arity", []string{"--table", "orders_history", "--key", "1"}, 2, nil, "2 key columns (shop, order_id), 1 values given"},
		{"missing key", []string{"--table", "orders_history"}, 2, nil, "--table and --key are required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(binary(t), append([]string{"history", "--config", cfg}, tc.args...)...)
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || !strings.Contains(errOut.String(), tc.err) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut.String(), tc.code, tc.err)
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				if l = strings.Join(strings.Fields(l), " "); l != "" {
					got = append(got, l)
				}
			}
			if strings.Join(got, "\n") != strings.Join(tc.lines, "\n") {
				t.Fatalf("stdout:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.lines, "\n"))
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"help", "-h", "--help"} {
		t.Run(arg, func(t *testing.T) {
			code, out, errOut := run(t, arg)
			if code != 0 || !strings.Contains(out, "history              print a key's versions") || errOut != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
			}
		})
	}
}
