package sink

// SetTruncateChunk makes truncates fold keys n at a time; it returns a
// function that restores the default.
func SetTruncateChunk(n int) (restore func()) {
	old := truncateChunk
	truncateChunk = n
	return func() { truncateChunk = old }
}
