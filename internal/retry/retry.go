// Package retry is how scd2sink waits out a failure: one policy and one
// loop, used by the consumer for a batch, by the sink for the chunks of
// its maintenance and the tables it creates, and by the commands.
//
// The caller's Classify says what an error is. Transient (a connection
// lost, a lock or statement timeout, a read-only failover) is retried
// with a short capped backoff; Blocked (a missing privilege, a table
// changed by hand) is retried slowly, for as long as it lasts, because
// only an operator can cure it and a crash loop would not; anything else
// is returned at once. A loop never nests another: the sink classifies
// the errors of a batch and returns them, and the consumer retries.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Class is what an error means for the one who retries it.
type Class int

// The classes of errors.
const (
	// Fatal errors are returned as they are.
	Fatal Class = iota
	// Transient errors go away by themselves: retry with backoff.
	Transient
	// Blocked errors need an operator (a missing privilege, a table
	// changed by hand): retry slowly, for as long as it lasts.
	Blocked
	// Data errors are a value PostgreSQL rejected (SQLSTATE class 22 or
	// 23): the sink isolates the events that carry it.
	Data
)

func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Blocked:
		return "blocked"
	case Data:
		return "data"
	}
	return "fatal"
}

// Policy says which failures are waited out, and how long each wait is.
type Policy struct {
	// Classify tells what an error is: only Transient and Blocked ones
	// are retried.
	Classify func(error) Class
	// Tries bounds the retries (0: for as long as the failure lasts).
	Tries int
	// Backoff is the first wait (0: 100 ms), doubled after each retry up
	// to Max for transient errors (0: 5 s) and BlockedMax for blocked
	// ones (0: Max).
	Backoff, Max, BlockedMax time.Duration
	// Jitter waits a random time between half of the backoff and all of
	// it, so that the members of a group do not retry in step.
	Jitter bool
	// OnRetry is called before each wait with the retry's number (0 for
	// the first), the error's class, the error and the wait: metrics,
	// health and logs.
	OnRetry func(attempt int, class Class, err error, wait time.Duration)
	// Interrupt, when set, gives for a class a channel that ends its
	// waits early: the error is then returned (nil: none). The consumer
	// ends a blocked wait when it drains.
	Interrupt func(Class) <-chan struct{}
}

// Do runs fn until it succeeds, fails with an error the policy does not
// wait out, the retries run out or ctx ends. It returns how many times it
// retried and fn's last error (nil on success).
func (p Policy) Do(ctx context.Context, fn func(context.Context) error) (int, error) {
	backoff := p.Backoff
	if backoff <= 0 {
		backoff = 100 * time.Millisecond
	}
	limit := p.Max
	if limit <= 0 {
		limit = 5 * time.Second
	}
	blockedLimit := p.BlockedMax
	if blockedLimit <= 0 {
		blockedLimit = limit
	}
	for attempt := 0; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return attempt, nil
		}
		class := p.Classify(err)
		if (class != Transient && class != Blocked) || (p.Tries > 0 && attempt >= p.Tries) || ctx.Err() != nil {
			return attempt, err
		}
		wait := backoff
		if p.Jitter {
			wait = backoff/2 + rand.N(backoff/2+1)
		}
		if p.OnRetry != nil {
			p.OnRetry(attempt, class, err, wait)
		}
		var interrupt <-chan struct{}
		if p.Interrupt != nil {
			interrupt = p.Interrupt(class)
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return attempt, err
		case <-interrupt:
			timer.Stop()
			return attempt, err
		case <-timer.C:
		}
		max := limit
		if class == Blocked {
			max = blockedLimit
		}
		backoff = min(backoff*2, max)
	}
}
