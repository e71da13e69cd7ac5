package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
)

// TestFreshDatabase: on a database the service never wrote, the commands
// say there is nothing yet in their own words (verify fails on each
// missing table), and none of them creates anything.
func TestFreshDatabase(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: ["127.0.0.1:1"]}
postgres: {dsn: %q}
tables:
  - {topic: shop.public.customers, target: customers_history}
  - {topic_pattern: 'shop\.public\..*', target: '{table}_history'}
`, dsn)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cases := []struct {
		name string
		run  func(out *bytes.Buffer) error
		want string
		err  string
	}{
		{"verify", func(out *bytes.Buffer) error {
			n, err := Verify(ctx, cfg, out)
			if err == nil && n != 1 {
				err = fmt.Errorf("%d violations, want 1", n)
			}
			return err
		}, "customers_history: no such table in schema public", ""},
		{"dead-letters list", func(out *bytes.Buffer) error { return ListDeadLetters(ctx, cfg, DeadLetterQuery{}, out) },
			"no dead letters: scd2sink has not written to schema public yet", ""},
		{"dead-letters replay", func(out *bytes.Buffer) error {
			return ReplayDeadLetters(ctx, cfg, Options{}, DeadLetterQuery{All: true}, out)
		}, "nothing to replay: scd2sink has not written to schema public yet", ""},
		{"reconcile", func(out *bytes.Buffer) error {
			err := Reconcile(ctx, cfg, Options{}, "customers_history", true, out)
			if !errors.Is(err, ErrNothingHeld) {
				return fmt.Errorf("got %v, want ErrNothingHeld", err)
			}
			out.WriteString(err.Error())
			return nil
		}, "no reconciliation of the table is held: scd2sink has not written to schema public yet", ""},
		{"history", func(out *bytes.Buffer) error {
			return History(ctx, cfg, HistoryQuery{Table: "customers_history", Key: []string{"1"}}, out)
		}, "", "customers_history: no such table in schema public yet"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			err := c.run(&out)
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("%v\n%s", err, out.String())
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("got %v, want an error saying %q", err, c.err)
			case !strings.Contains(out.String(), c.want):
				t.Fatalf("output %q lacks %q", out.String(), c.want)
			}
			if err != nil && strings.Contains(err.Error(), "SQLSTATE") {
				t.Errorf("PostgreSQL's words: %v", err)
			}
		})
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var created []string
	rows, err := pool.Query(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		_ = rows.Scan(&name)
		created = append(created, name)
	}
	if rows.Err() != nil || len(created) > 0 {
		t.Errorf("the commands created %v (%v)", created, rows.Err())
	}
}
