package app

import (
	"context"
	"time"

	"github.com/scd2sink/scd2sink/internal/retry"
	"github.com/scd2sink/scd2sink/sink"
)

// commandRetry is how a command waits out a transient PostgreSQL error
// (internal/retry's loop, the consumer's too): a few tries, then it exits
// with the error; a blocked or rejected one exits at once with its hint,
// as does a lock or statement timeout of one table (sink.ParkTarget: a
// reader holds it; running the command again later is the cure).
// The sink does not retry a batch itself: what a command applies, it
// retries here.
var commandRetry = retry.Policy{Tries: 5, Backoff: 50 * time.Millisecond, Max: 5 * time.Second, Jitter: true,
	Classify: func(err error) retry.Class {
		if _, one := sink.ParkTarget(err); one {
			return retry.Fatal
		}
		if sink.Classify(err) == sink.Transient {
			return retry.Transient
		}
		return retry.Fatal
	}}

// retried runs fn with commandRetry.
func retried(ctx context.Context, fn func(ctx context.Context) error) error {
	_, err := commandRetry.Do(ctx, fn)
	return err
}
