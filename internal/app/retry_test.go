package app

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/scd2sink/scd2sink/sink"
)

// TestCommandRetry: a command retries a transient error a few times, and
// stops at once on one table's lock or statement timeout (a reader holds
// the table: running the command later is the cure, not waiting inside
// it) and on errors waiting does not cure.
func TestCommandRetry(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "injected"} }
	cases := []struct {
		name  string
		err   error
		tries int
	}{
		{"serialization failure", pg("40001"), 1 + commandRetry.Tries}, // the first try and Tries retries
		{"one table's lock timeout", &sink.TargetError{Target: "t_history", Err: fmt.Errorf("applying batch to t_history: %w", pg("55P03"))}, 1},
		{"one table's statement timeout", &sink.TargetError{Target: "t_history", Err: pg("57014")}, 1},
		{"a value PostgreSQL rejects", pg("22P02"), 1},
		{"a missing privilege", pg("42501"), 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tries := 0
			err := retried(context.Background(), func(context.Context) error { tries++; return c.err })
			if err == nil {
				t.Fatal("retried returned nil for an error every try")
			}
			if tries != c.tries {
				t.Errorf("%d tries, want %d", tries, c.tries)
			}
		})
	}
}
