package app

import (
	"testing"
	"time"
)

// TestQuietAfter: sequencer.quiet_after as the consumer takes it: absent
// is its default (0), 0s is never (negative), a duration is itself.
func TestQuietAfter(t *testing.T) {
	d := func(v time.Duration) *time.Duration { return &v }
	for _, tc := range []struct {
		name string
		in   *time.Duration
		want time.Duration
	}{
		{"absent", nil, 0},
		{"off", d(0), -1},
		{"set", d(300 * time.Millisecond), 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := quietAfter(tc.in); got != tc.want {
				t.Fatalf("quietAfter = %v, want %v", got, tc.want)
			}
		})
	}
}
