package consumer

import (
	"testing"
	"time"
)

// TestBatchOld: a batch whose oldest event waited out a reorder window
// shorter than batch_max_wait is old enough once it has gathered for
// coalesce (a twenty-fifth of batch_max_wait at most); otherwise
// batch_max_wait holds, for the oldest event and since the last hand-over.
func TestBatchOld(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name         string
		window, wait time.Duration
		age, flushed time.Duration // of the oldest event, since the last hand-over
		want         bool
	}{
		{"short window, waited out, gathered", 100 * ms, 250 * ms, 110 * ms, 25 * ms, true},
		{"short window, waited out, just handed over", 100 * ms, 250 * ms, 110 * ms, 5 * ms, false},
		{"short window, not waited out", 100 * ms, 250 * ms, 90 * ms, 90 * ms, false},
		{"window just under the wait: coalesce is the rest", 240 * ms, 250 * ms, 240 * ms, 10 * ms, true},
		{"window just under the wait, too soon", 240 * ms, 250 * ms, 240 * ms, 9 * ms, false},
		{"window equal to the wait", 250 * ms, 250 * ms, 249 * ms, 249 * ms, false},
		{"window longer: batch_max_wait", time.Second, 250 * ms, 250 * ms, 250 * ms, true},
		{"window longer, handed over within batch_max_wait", time.Second, 250 * ms, 2 * time.Second, 100 * ms, false},
		{"no window, handed over within batch_max_wait", 0, 250 * ms, 300 * ms, 100 * ms, false},
		{"window longer, younger", time.Second, 250 * ms, 249 * ms, 249 * ms, false},
		{"short window, first batch", 100 * ms, 250 * ms, 100 * ms, time.Since(time.Time{}), true},
		{"no window", 0, 250 * ms, 200 * ms, 200 * ms, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			c := &Consumer{cfg: Config{ReorderWindow: tc.window, BatchMaxWait: tc.wait}, since: now.Add(-tc.age), flushed: now.Add(-tc.flushed)}
			if got := c.old(now); got != tc.want {
				t.Fatalf("old = %v, want %v", got, tc.want)
			}
		})
	}
}
