package consumer

import "time"

// SetRevokeBudget changes revokeBudget for a test and returns a function
// restoring it.
func SetRevokeBudget(d time.Duration) (restore func()) {
	old := revokeBudget
	revokeBudget = d
	return func() { revokeBudget = old }
}
