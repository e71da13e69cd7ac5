package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/retry"
	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
)

// Preparing and applying a batch, and retrying what fails for a while.

// apply applies p, a job's prepared batch or a part of it (park.go),
// retrying transient errors until ctx ends; an error that parks a target
// is returned at once.
func (c *Consumer) apply(ctx context.Context, j job, p *sink.Prepared) error {
	return c.applyWith(ctx, j, p, c.batches.ApplyPrepared)
}

// applyWith is apply through fn (ApplyPrepared, or ApplyPart for a probe).
func (c *Consumer) applyWith(ctx context.Context, j job, p *sink.Prepared, fn func(context.Context, *sink.Prepared) (sink.Result, error)) error {
	what := fmt.Sprintf("applying batch of %d events", j.events)
	return c.retry(ctx, "apply", what, func() (err error) {
		defer c.recoverPanic(what, j.offsets, &err)
		start := time.Now()
		res, err := fn(ctx, p)
		c.m.ApplySeconds.Observe(time.Since(start).Seconds())
		// On an error res holds what committed (parts applied side by
		// side): their dead letters are logged and counted too.
		c.m.record(res)
		c.deadLog.log(c.log, res.Dead)
		c.disagreeLog.logDisagreements(c.log, res.Disagree)
		c.expiredLog.logExpired(c.log, res.ExpiredNotes)
		return err
	})
}

// prepare prepares one batch, cut at park epoch epoch, retrying transient
// errors until ctx ends. Parked targets are left out of it, and a target
// whose DDL or schema check fails as sink.ParkTarget says is parked and
// the batch prepared again without it (park.go). Called with mu held.
func (c *Consumer) prepare(ctx context.Context, b sink.Batch, epoch int64) (job, error) {
	skip, probe := c.park.Rules(epoch)
	// A probing target's part is prepared by its probe, on its goroutine:
	// its DDL's lock wait (a column added while a DBA holds the table)
	// would hold this loop, and every other table with it.
	var alone map[string]sink.Batch
	if c.park.Any() {
		for _, t := range c.batchTargets(b) {
			if probe(t) {
				if alone == nil {
					alone = map[string]sink.Batch{}
				}
				alone[t] = c.withoutParked(b, func(x string) bool { return x != t })
			}
		}
	}
	if alone != nil {
		b = c.withoutParked(b, func(x string) bool { _, ok := alone[x]; return ok || skip(x) })
	} else {
		b = c.withoutParked(b, skip)
	}
	for {
		j := job{offsets: sink.Offsets(b.Positions), events: len(b.Events), rewound: rewoundOf(b.Positions), parkEpoch: epoch, alone: alone}
		what := fmt.Sprintf("preparing batch of %d events", len(b.Events))
		err := c.retry(ctx, "prepare", what, func() (err error) {
			defer c.recoverPanic(what, j.offsets, &err)
			j.prepared, err = c.batches.Prepare(ctx, b)
			return err
		})
		t, park := sink.ParkTarget(err)
		if !park || ctx.Err() != nil {
			return j, err
		}
		c.parkTarget(t, err)
		b = c.withoutParked(b, func(x string) bool { return x == t || skip(x) })
	}
}

// batchTargets lists the targets b holds anything of.
func (c *Consumer) batchTargets(b sink.Batch) []string {
	seen := map[string]bool{}
	var out []string
	add := func(t string) {
		if t != "" && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	for _, ev := range b.Events {
		add(ev.Table)
	}
	for p := range b.Positions {
		add(c.target(p.Topic))
	}
	for _, d := range b.DeadLetters {
		add(c.deadTarget(d))
	}
	sort.Strings(out)
	return out
}

// recoverPanic turns a panic while preparing or applying a batch into an
// error that stops the service loudly, logged with the batch's offsets and
// the stack: never a silent exit, never a loop. Deferred.
func (c *Consumer) recoverPanic(what string, offsets map[change.Partition]int64, err *error) {
	r := recover()
	if r == nil {
		return
	}
	var parts []string
	for p, o := range offsets {
		parts = append(parts, fmt.Sprintf("%s/%d@%d", p.Topic, p.Partition, o))
	}
	sort.Strings(parts)
	c.log.Error("panic "+what+"; stopping (nothing of the batch was committed)", zap.Any("panic", r),
		zap.Strings("offsets", parts), zap.ByteString("stack", debug.Stack()))
	*err = fmt.Errorf("%s (offsets %s): panic: %v", what, strings.Join(parts, ", "), r)
}

// Backoff of retries: transient errors (an outage) are tried again soon,
// blocked ones (a table changed by hand, a missing grant) slowly, and a
// blocked error is logged again only this often while it lasts.
var (
	transientBackoffMax = 10 * time.Second
	blockedBackoffMax   = 30 * time.Second
	blockedLogEvery     = 5 * time.Minute
)

// retry runs fn until it succeeds, fails with an error neither transient
// nor blocked, or ctx ends (internal/retry's loop: the one that retries a
// batch; the sink returns its errors classified). Meanwhile /readyz says
// what it waits for and scd2sink_retries_total counts each try by
// SQLSTATE; warnings come at a bounded rate. It never gives up on an
// outage, however long.
func (c *Consumer) retry(ctx context.Context, stage, what string, fn func() error) error {
	var lastLogged string
	var loggedAt time.Time
	blocked := false // the last error was blocked
	p := retry.Policy{Backoff: 100 * time.Millisecond, Max: transientBackoffMax, BlockedMax: blockedBackoffMax,
		Classify: func(err error) retry.Class {
			blocked = false
			unsure := errors.As(err, new(kafkaUnsure))
			if _, park := sink.ParkTarget(err); park && !unsure {
				return retry.Fatal // one table's: parked, the others go on (park.go)
			}
			if unsure {
				return retry.Transient // Kafka, not PostgreSQL, is unavailable
			}
			class := c.cfg.Classify(err)
			if class == sink.Data {
				// A value rejected outside the per-key isolation
				// (bookkeeping of a key change, a truncate, the dead
				// letters themselves): not one event's fault, so wait for
				// an operator like a blocked table instead of exiting into
				// a crash loop.
				class = sink.Blocked
			}
			blocked = class == sink.Blocked
			if blocked && c.draining.Load() {
				return retry.Fatal
			}
			return class
		},
		OnRetry: func(attempt int, class retry.Class, err error, _ time.Duration) {
			state := sink.SQLState(err)
			c.m.Retries.WithLabelValues(state).Inc()
			c.health.Wait(stage, fmt.Sprintf("%s: retrying: %s", what, sink.Summary(err))) // never a value: /readyz is read by many
			if class == sink.Blocked {
				if msg := err.Error(); msg != lastLogged || time.Since(loggedAt) > blockedLogEvery {
					lastLogged, loggedAt = msg, time.Now()
					c.log.Error("progress stopped until this is fixed (retrying slowly; a fix made live is picked up)",
						zap.String("what", what), zap.String("sqlstate", state), zap.String("hint", sink.Hint(err)), zap.Error(err))
				}
				return
			}
			c.health.Postgres.Store(false)
			if attempt%10 == 0 {
				c.log.Warn("PostgreSQL unavailable, retrying", zap.String("what", what), zap.String("sqlstate", state),
					zap.Int("attempt", attempt+1), zap.Error(err))
			}
		},
		Interrupt: func(class retry.Class) <-chan struct{} {
			if class == sink.Blocked {
				return c.drainStart // a drain leaves a blocked batch for the next start
			}
			return nil
		}}
	attempts, err := p.Do(ctx, func(context.Context) error { return fn() })
	switch {
	case err == nil:
		c.health.Postgres.Store(true)
		c.health.Wait(stage, "")
		if attempts > 0 {
			c.log.Info("PostgreSQL accepted the batch again", zap.String("what", what), zap.Int("attempts", attempts+1))
		}
		return nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return ctx.Err()
	case blocked && c.draining.Load():
		return fmt.Errorf("%s (left for the next start): %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
