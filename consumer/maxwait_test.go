package consumer

import (
	"testing"
	"time"
)

// TestMaxWait: a batch whose events waited out a reorder window shorter
// than batch_max_wait is old enough once released; otherwise
// batch_max_wait holds.
func TestMaxWait(t *testing.T) {
	for _, tc := range []struct {
		name         string
		window, wait time.Duration
		want         time.Duration
	}{
		{"window shorter", 100 * time.Millisecond, 250 * time.Millisecond, 100 * time.Millisecond},
		{"window longer", time.Second, 250 * time.Millisecond, 250 * time.Millisecond},
		{"no window", 0, 250 * time.Millisecond, 250 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Consumer{cfg: Config{ReorderWindow: tc.window, BatchMaxWait: tc.wait}}
			if got := c.maxWait(); got != tc.want {
				t.Fatalf("maxWait = %s, want %s", got, tc.want)
			}
		})
	}
}
