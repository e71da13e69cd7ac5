package app

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
)

// retentionEvery is how often run removes what retention no longer keeps
// (tables[].retention); the first pass waits retentionFirst after start so
// that it does not compete with the catch-up of a restart (tests shorten
// both: Options).
const (
	retentionEvery = time.Hour
	retentionFirst = time.Minute
)

// retainer runs retention passes over the tables that have a retention,
// one table at a time, until its context ends. A failed pass is logged
// and shown on /readyz until the next one succeeds: retention waits, the
// pipeline does not stop for it.
type retainer struct {
	s       *sink.Sink
	log     *zap.Logger
	metrics *consumer.Metrics
	health  *consumer.Health
	now     func() time.Time
	// first and every are the schedule (0: retentionFirst, retentionEvery).
	first, every time.Duration
}

// Run runs a pass retentionFirst after it starts, then every
// retentionEvery (retentionFirst after a pass that failed), until ctx
// ends.
func (r *retainer) Run(ctx context.Context) error {
	first, every := r.first, r.every
	if first <= 0 {
		first = retentionFirst
	}
	if every <= 0 {
		every = retentionEvery
	}
	wait := first
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = every
		if !r.pass(ctx) {
			wait = min(first, every) // soon, not in an hour
		}
	}
}

// pass runs one retention pass over every table that has a retention
// and reports whether all of it succeeded. A panic in it is a failed
// pass, logged with its stack: retention never takes the pipeline down.
func (r *retainer) pass(ctx context.Context) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			ok = false
			r.failed(ctx, "", fmt.Errorf("retention pass panicked: %v\n%s", p, debug.Stack()))
		}
	}()
	ok = true
	if err := r.s.PartitionsAhead(ctx, r.now()); err != nil {
		ok = false
		r.failed(ctx, "", err) // retention goes on
	}
	targets, err := r.s.RetainedTargets(ctx)
	if err != nil {
		r.failed(ctx, "", err)
		return false
	}
	for _, target := range targets {
		start := time.Now()
		var seen sink.RetainResult
		res, err := r.s.Retain(ctx, target, r.now(), func(p sink.RetainResult) {
			r.metrics.RetentionRemoved.WithLabelValues(target, "history").Add(float64(p.Versions - seen.Versions))
			r.metrics.RetentionRemoved.WithLabelValues(target, "side").Add(float64(p.SideRows - seen.SideRows))
			seen = p
		})
		if err != nil {
			ok = false
			r.failed(ctx, target, err)
			continue
		}
		r.metrics.RetentionRemoved.WithLabelValues(target, "partitions").Add(float64(res.Partitions))
		if !res.Horizon.IsZero() {
			r.metrics.RetentionHorizon.WithLabelValues(target).Set(float64(res.Horizon.UnixNano()) / 1e9)
		}
		if res.Keys > 0 || res.Partitions > 0 || res.PartitionsWaiting > 0 {
			r.log.Info("retention removed old versions", zap.String("target", target), zap.Time("horizon", res.Horizon),
				zap.Int64("versions", res.Versions), zap.Int64("side_rows", res.SideRows), zap.Int64("keys", res.Keys), zap.Int("partitions", res.Partitions),
				zap.Int("partitions_waiting", res.PartitionsWaiting), zap.Int("transactions", res.Chunks), zap.Duration("took", time.Since(start)))
		}
	}
	if ok {
		r.health.Wait("retention", "")
	}
	return ok
}

func (r *retainer) failed(ctx context.Context, target string, err error) {
	if ctx.Err() != nil {
		return
	}
	r.metrics.RetentionFailures.WithLabelValues(target).Inc()
	r.health.Wait("retention", "retention of "+target+" failed, trying again at the next pass: "+err.Error())
	r.log.Error("retention pass failed; trying again at the next pass", zap.String("target", target),
		zap.String("hint", sink.Hint(err)), zap.Error(err))
}
