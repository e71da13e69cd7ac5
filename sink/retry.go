package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/retry"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/history"
	"github.com/scd2sink/scd2sink/sink/plan"
	"go.uber.org/zap"
)

// Class is what the service does about an error from PostgreSQL
// (DESIGN.md section 6, retry.Class): decided by SQLSTATE class, never
// by message.
type Class = retry.Class

// The error classes.
const (
	// Fatal errors stop the service loudly (exit 1): a bug or something no
	// wait can fix.
	Fatal = retry.Fatal
	// Transient errors (connection, serialization, resources such as a
	// full disk, lock timeouts, cancellations, shutdowns, a read-only
	// database during a failover) are retried with capped backoff for as
	// long as they last.
	Transient = retry.Transient
	// Blocked errors (a history table changed by hand, a missing
	// privilege, failed authentication) stop progress with one clear error
	// and are retried slowly, so that a fix made live is picked up.
	Blocked = retry.Blocked
	// Data errors are a value PostgreSQL rejects for its column: the
	// event carrying it is dead-lettered.
	Data = retry.Data
)

// TargetError is a failure that belongs to one target (plan.TargetError).
type TargetError = plan.TargetError

// ParkTarget reports the target err belongs to when the error is one that
// parking the target's partitions waits out while the other targets go
// on: blocked and data errors, and lock and statement timeouts (another
// session holds one table). What is the whole database's (a connection
// lost, a shutdown, a full disk, a read-only failover, a serialization
// failure) is retried for every target alike.
func ParkTarget(err error) (string, bool) {
	var te *TargetError
	if !errors.As(err, &te) {
		return "", false
	}
	switch Classify(err) {
	case Blocked, Data:
		return te.Target, true
	}
	switch SQLState(err) {
	case "55P03", "57014":
		return te.Target, true
	}
	return "", false
}

// IsTransient reports whether an error from Apply is worth retrying soon
// (Classify is Transient).
func IsTransient(err error) bool { return Classify(err) == Transient }

// Classify tells what to do about err (DESIGN.md section 6's table).
func Classify(err error) Class {
	if err == nil {
		return Fatal
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		// A refused password or role, or a database that does not exist,
		// is no outage: wait for a fix. Anything else (refused, timed out:
		// connect_timeout surfaces as a deadline) is one.
		var pgErr *pgconn.PgError
		if errors.As(connErr, &pgErr) && len(pgErr.Code) == 5 && (pgErr.Code[:2] == "28" || pgErr.Code == "3D000") {
			return Blocked
		}
		return Transient
	}
	// The caller's context ending: callers check ctx.Err() and stop; a
	// deadline inside pgx (a connect or read timeout) is an outage.
	if errors.Is(err, context.Canceled) {
		return Fatal
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Transient
	}
	var drift *DriftError
	if errors.As(err, &drift) {
		return Blocked
	}
	var constraint *catalog.ConstraintError
	if errors.As(err, &constraint) {
		return Blocked // btree_gist missing, versions overlapping: waits for a fix
	}
	if catalog.NoPartition(err) {
		return Transient // a partition dropped since it was cached (partition.go)
	}
	if history.StaleStatement(err) {
		// A column's type changed under a prepared statement (altered by
		// hand, or by another instance widening it): once drops the
		// pool's connections, and the next try prepares and describes
		// anew.
		return Transient
	}
	var pgErr *pgconn.PgError
	if catalog.OverlapRefused(err) {
		// The no-overlap constraint refused what a batch made: never an
		// event's fault (no event is dead-lettered for it): the table
		// waits, loudly.
		return Blocked
	}
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch code := pgErr.Code; {
		case code == "55P03", code == "57014", code == "25006", code == "25P03", code == "57P05",
			code >= "57P01" && code <= "57P03":
			// 25P03/57P05: a session cut by idle_in_transaction_session_timeout
			// or idle_session_timeout.
			return Transient
		case code == "3D000":
			return Blocked
		case code == "42501":
			return Blocked
		}
		switch pgErr.Code[:2] {
		case "08", "40", "53", "58":
			return Transient
		case "42", "28":
			return Blocked
		case "22", "23":
			return Data
		}
		return Fatal
	}
	var netErr net.Error
	if errors.As(err, &netErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return Transient
	}
	// pgx reports a connection that died under it as "conn closed" or
	// "unexpected EOF" wrapped in its own types.
	msg := err.Error()
	for _, s := range []string{"conn closed", "connection reset", "broken pipe", "unexpected EOF", "failed to deallocate", "conn busy"} {
		if strings.Contains(msg, s) {
			return Transient
		}
	}
	return Fatal
}

// Hint says what an operator does about a blocked error ("" for others).
func Hint(err error) string {
	var drift *DriftError
	if errors.As(err, &drift) {
		return "the history table is not as scd2sink keeps it: put back what was changed by hand (verify lists it)"
	}
	var constraint *catalog.ConstraintError
	if errors.As(err, &constraint) {
		return "create btree_gist as an administrator, or mend the overlapping versions verify lists; the table is picked up again by itself"
	}
	if SQLState(err) == "23P01" {
		return "the no-overlap constraint refused versions that overlap: run scd2sink verify and report it; the table waits"
	}
	switch code := SQLState(err); {
	case code == "42703":
		return "a column scd2sink writes is missing (dropped by hand?): add it back, or list it in ignore_columns and restart"
	case code == "42P01":
		return "a table scd2sink writes is missing (dropped by hand?): restore it, or restart to create it anew"
	case code == "42501":
		return "a privilege is missing: grant what docs/operations.md's Least privilege section lists"
	case strings.HasPrefix(code, "28"):
		return "PostgreSQL refused the login: check the role and its password (postgres.dsn)"
	case strings.HasPrefix(code, "42"):
		return "the history table or its objects were changed by hand: put them back (verify lists what it relies on)"
	}
	return ""
}

// SQLState is err's SQLSTATE, or "network" for a connection that failed
// without one; the label of scd2sink_retries_total.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	var drift *DriftError
	if errors.As(err, &drift) {
		return "drift"
	}
	var constraint *catalog.ConstraintError
	if errors.As(err, &constraint) {
		return "constraint"
	}
	return "network"
}

// withRetry runs fn, a step of maintenance (stage: erase, retention,
// partitions, verify or a reconciliation's chunk), retrying transient
// errors with the Sink's policy (Config.MaxRetries, MaxBackoff) until it
// succeeds, fails otherwise or ctx ends. It returns the number of
// retries. The batch path does not retry (once): its caller does.
func (s *Sink) withRetry(ctx context.Context, stage, what string, fn func(context.Context) error) (int, error) {
	p := retry.Policy{Tries: s.cfg.MaxRetries, Backoff: 50 * time.Millisecond, Max: s.cfg.MaxBackoff, Jitter: true,
		Classify: func(err error) retry.Class {
			if _, park := ParkTarget(err); park {
				return Fatal // one table's: the consumer parks it, the others go on
			}
			if Classify(err) == Transient {
				return Transient
			}
			return Fatal
		},
		OnRetry: func(attempt int, _ retry.Class, err error, wait time.Duration) {
			if s.cfg.OnRetry != nil {
				s.cfg.OnRetry(stage, what, err)
			}
			if attempt == 0 || attempt%5 == 4 {
				s.log.Warn("transient PostgreSQL error, retrying", zap.String("what", what), zap.Int("attempt", attempt+1),
					zap.Duration("wait", wait), zap.Error(err))
			}
		}}
	if s.cfg.MaxRetries < 0 {
		return 0, once(ctx, s.pool, fn) // no retries
	}
	n, err := p.Do(ctx, func(ctx context.Context) error { return once(ctx, s.pool, fn) })
	if n > 0 && s.cfg.OnRetry != nil {
		s.cfg.OnRetry(stage, what, nil) // the step is over: no longer waiting
	}
	return n, err
}

// once runs fn once: a step of the batch path (Init, Prepare's tables,
// a batch's transaction), whose caller retries it — the consumer or a
// command, with internal/retry. A statement prepared, or a COPY's column
// types described, for a column's old type empties the pool first: every
// connection may hold one.
func once(ctx context.Context, pool *pgxpool.Pool, fn func(context.Context) error) error {
	err := fn(ctx)
	if err != nil && history.StaleStatement(err) {
		pool.Reset()
	}
	return err
}

// Summary says what err is in a line fit for a status page: its class,
// its SQLSTATE and PostgreSQL's message, never a value. Data errors
// (SQLSTATE classes 22 and 23) and errors other than PostgreSQL's may
// quote an event's values, so they show only their class and code.
func Summary(err error) string {
	if err == nil {
		return ""
	}
	code := SQLState(err)
	what := map[string]string{"55P03": "lock timeout: another session holds a lock the table's writes need",
		"57014": "statement timeout", "25006": "PostgreSQL is read-only (a standby, or after a failover)",
		"42501": "permission denied", "53100": "disk full", "40P01": "deadlock", "40001": "serialization failure",
		"42P01": "a table scd2sink writes is missing", "42703": "a column scd2sink writes is missing",
		"drift": "the history table is not as scd2sink keeps it", "network": "PostgreSQL unreachable",
		"constraint": "history_constraint cannot be added yet", "23P01": "the no-overlap constraint refused versions that overlap"}[code]
	if what == "" {
		what = Classify(err).String() + " error"
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(code) == 5 && code[:2] != "22" && code[:2] != "23" {
		return fmt.Sprintf("%s (SQLSTATE %s: %s)", what, code, pgErr.Message)
	}
	if code == "network" || code == "drift" || code == "constraint" {
		return what
	}
	return fmt.Sprintf("%s (SQLSTATE %s)", what, code)
}
