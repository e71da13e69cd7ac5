package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/retry"
)

var (
	errTransient = errors.New("transient")
	errBlocked   = errors.New("blocked")
	errFatal     = errors.New("fatal")
)

func classify(err error) retry.Class {
	switch {
	case errors.Is(err, errTransient):
		return retry.Transient
	case errors.Is(err, errBlocked):
		return retry.Blocked
	}
	return retry.Fatal
}

func TestDo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		errs    []error // fn's results, in turn; then nil
		tries   int
		retries int
		err     error
		waits   []time.Duration
	}{
		{"succeeds at once", nil, 0, 0, nil, nil},
		{"waits out transient errors", []error{errTransient, errTransient}, 0, 2, nil, []time.Duration{time.Millisecond, 2 * time.Millisecond}},
		{"blocked waits grow to their own cap", []error{errBlocked, errBlocked, errBlocked, errBlocked}, 0, 4, nil,
			[]time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 5 * time.Millisecond}},
		{"transient waits stop at the cap", []error{errTransient, errTransient, errTransient}, 0, 3, nil,
			[]time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}},
		{"a fatal error is returned at once", []error{errTransient, errFatal}, 0, 1, errFatal, []time.Duration{time.Millisecond}},
		{"the tries run out", []error{errTransient, errTransient, errTransient}, 2, 2, errTransient, []time.Duration{time.Millisecond, 2 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var waits []time.Duration
			calls := 0
			p := retry.Policy{Classify: classify, Tries: tc.tries, Backoff: time.Millisecond, Max: 3 * time.Millisecond, BlockedMax: 5 * time.Millisecond,
				OnRetry: func(attempt int, class retry.Class, err error, wait time.Duration) {
					if attempt != len(waits) || class != classify(err) {
						t.Errorf("OnRetry(%d, %s, %v): want attempt %d", attempt, class, err, len(waits))
					}
					waits = append(waits, wait)
				}}
			n, err := p.Do(context.Background(), func(context.Context) error {
				calls++
				if calls <= len(tc.errs) {
					return tc.errs[calls-1]
				}
				return nil
			})
			if n != tc.retries || !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Errorf("Do = %d, %v; want %d, %v", n, err, tc.retries, tc.err)
			}
			if len(waits) != len(tc.waits) {
				t.Fatalf("waits %v, want %v", waits, tc.waits)
			}
			for i := range waits {
				if waits[i] != tc.waits[i] {
					t.Errorf("waits %v, want %v", waits, tc.waits)
					break
				}
			}
		})
	}
}

// TestDoEndsWaits: a wait ends with ctx, and with the policy's interrupt
// for its class; the last error is returned.
func TestDoEndsWaits(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	p := retry.Policy{Classify: classify, Backoff: time.Hour, OnRetry: func(int, retry.Class, error, time.Duration) { cancel() }}
	start := time.Now()
	if _, err := p.Do(ctx, func(context.Context) error { return errTransient }); !errors.Is(err, errTransient) || time.Since(start) > time.Minute {
		t.Fatalf("Do after cancel = %v (%s)", err, time.Since(start))
	}
	drain := make(chan struct{})
	close(drain)
	p = retry.Policy{Classify: classify, Backoff: time.Hour, Interrupt: func(c retry.Class) <-chan struct{} {
		if c == retry.Blocked {
			return drain
		}
		return nil
	}}
	if _, err := p.Do(context.Background(), func(context.Context) error { return errBlocked }); !errors.Is(err, errBlocked) {
		t.Fatalf("Do interrupted = %v", err)
	}
}
