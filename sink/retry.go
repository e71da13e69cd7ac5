package sink

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// IsTransient reports whether an error from Apply is worth retrying later
// (the database was unreachable or the transaction lost a race); anything
// else is permanent.
func IsTransient(err error) bool { return isTransient(err) }

// isTransient reports whether err is worth retrying: serialization failures,
// deadlocks, lost or refused connections, and server shutdowns.
func isTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "57P01", "57P02", "57P03", "53300", "55P03":
			return true
		}
		return len(pgErr.Code) == 5 && pgErr.Code[:2] == "08"
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	// pgx reports a connection that died under it as "conn closed" or
	// "unexpected EOF" wrapped in its own types.
	msg := err.Error()
	for _, s := range []string{"conn closed", "connection reset", "broken pipe", "unexpected EOF", "failed to deallocate", "conn busy"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// withRetry runs fn until it succeeds, fails permanently, the retries run
// out or ctx ends, waiting with capped exponential backoff and jitter.
// It returns the number of retries.
func (s *Sink) withRetry(ctx context.Context, what string, fn func(context.Context) error) (int, error) {
	backoff := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return attempt, nil
		}
		if !isTransient(err) || attempt >= s.cfg.MaxRetries || ctx.Err() != nil {
			return attempt, err
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if attempt == 0 || attempt%5 == 4 {
			s.log.Warn("transient PostgreSQL error, retrying", zap.String("what", what), zap.Int("attempt", attempt+1),
				zap.Duration("wait", wait), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return attempt, err
		case <-time.After(wait):
		}
		if backoff *= 2; backoff > s.cfg.MaxBackoff {
			backoff = s.cfg.MaxBackoff
		}
	}
}
