package sink_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/scd2sink/scd2sink/sink"
)

// TestClassify is DESIGN.md section 6's table, by SQLSTATE and by the
// shapes in which pgx reports a connection that failed.
func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code string) error {
		return fmt.Errorf("applying batch to t: %w", &pgconn.PgError{Code: code, Message: "x"})
	}
	for _, tc := range []struct {
		name string
		err  error
		want sink.Class
	}{
		{"connection failure", pg("08006"), sink.Transient},
		{"serialization", pg("40001"), sink.Transient},
		{"deadlock", pg("40P01"), sink.Transient},
		{"disk full", pg("53100"), sink.Transient},
		{"out of memory", pg("53200"), sink.Transient},
		{"too many connections", pg("53300"), sink.Transient},
		{"lock timeout", pg("55P03"), sink.Transient},
		{"statement timeout", pg("57014"), sink.Transient},
		{"admin shutdown", pg("57P01"), sink.Transient},
		{"crash shutdown", pg("57P02"), sink.Transient},
		{"cannot connect now", pg("57P03"), sink.Transient},
		{"idle session timeout", pg("57P05"), sink.Transient},
		{"idle in transaction timeout", pg("25P03"), sink.Transient},
		{"read-only (failover)", pg("25006"), sink.Transient},
		{"system error", pg("58030"), sink.Transient},
		{"a column's type changed under a cached plan", fmt.Errorf("reading: %w", &pgconn.PgError{Code: "0A000", Message: "cached plan must not change result type"}), sink.Transient},
		{"another feature not supported", pg("0A000"), sink.Fatal},
		{"binary data of a column's old type", pg("22P03"), sink.Transient},
		{"a value encoded for a column's old type", fmt.Errorf("inserting: %w", errors.New("COPY from stdin failed: unable to encode 5000000000 into binary format for int4 (OID 23)")), sink.Transient},
		{"string too long", pg("22001"), sink.Data},
		{"check violation", pg("23514"), sink.Data},
		{"undefined column", pg("42703"), sink.Blocked},
		{"undefined table", pg("42P01"), sink.Blocked},
		{"insufficient privilege", pg("42501"), sink.Blocked},
		{"invalid password", pg("28P01"), sink.Blocked},
		{"no such database", pg("3D000"), sink.Blocked},
		{"drift", &sink.DriftError{Table: "t", What: "x"}, sink.Blocked},
		{"raised by a user's trigger", pg("P0001"), sink.Fatal},
		{"internal error", pg("XX000"), sink.Fatal},
		{"unexpected EOF", fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), sink.Transient},
		{"a deadline inside pgx (connect_timeout)", fmt.Errorf("dial: %w", context.DeadlineExceeded), sink.Transient},
		{"the caller's cancel", fmt.Errorf("x: %w", context.Canceled), sink.Fatal},
		{"anything else", errors.New("boom"), sink.Fatal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sink.Classify(tc.err); got != tc.want {
				t.Errorf("Classify(%v) = %s, want %s", tc.err, got, tc.want)
			}
		})
	}
	// A connection that cannot be made at all: refused, or timed out.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := pgconn.Connect(ctx, "postgres://u@127.0.0.1:1/db?connect_timeout=1")
	if got := sink.Classify(err); got != sink.Transient {
		t.Errorf("Classify(%v) = %s, want transient", err, got)
	}
}
