package sink

// SetTruncateChunk makes truncates fold keys n at a time; it returns a
// function that restores the default.
func SetTruncateChunk(n int) (restore func()) {
	old := truncateChunk
	truncateChunk = n
	return func() { truncateChunk = old }
}

// SetWholeRepairs makes repairs read their keys' whole history (on) or
// only from the version before a late event (off); it returns a function
// that restores the default.
func SetWholeRepairs(on bool) (restore func()) {
	old := wholeRepairs
	wholeRepairs = on
	return func() { wholeRepairs = old }
}

// BoundedRepairs is how many repairs have stopped at a boundary so far.
func BoundedRepairs() int64 { return boundedRepairs.Load() }

// SetUnboundedRepairs makes partial repairs read on to the end of their
// keys' histories (no boundary); it returns a function that restores the
// default.
func SetUnboundedRepairs(on bool) (restore func()) {
	old := unboundedRepairs
	unboundedRepairs = on
	return func() { unboundedRepairs = old }
}

// SetMinSplitEvents sets the smallest batch applied in parts; it returns
// a function that restores the default.
func SetMinSplitEvents(n int) (restore func()) {
	old := minSplitEvents
	minSplitEvents = n
	return func() { minSplitEvents = old }
}

// SplitBatches is how many batches have been applied in parts so far.
func SplitBatches() int64 { return splitBatches.Load() }

// SetReconcileChunk makes reconciliations close keys n per transaction and
// calls after (when not nil) once each chunk has committed; it returns a
// function that restores the defaults.
func SetReconcileChunk(n int, after func()) (restore func()) {
	old, oldAfter := reconcileChunk, afterReconcileChunk
	reconcileChunk, afterReconcileChunk = n, after
	return func() { reconcileChunk, afterReconcileChunk = old, oldAfter }
}

// PartitionLock is the advisory lock key the Sink's batches take for a
// partition of its consumer group (-1: the topic's, once resized).
func (s *Sink) PartitionLock(topic string, partition int32) int64 {
	return s.partitionLock(topic, partition)
}

// SetRetentionChunk makes retention handle n keys per transaction; it
// returns a function that restores the default.
func SetRetentionChunk(n int) (restore func()) {
	old := retentionChunk
	retentionChunk = n
	return func() { retentionChunk = old }
}

// SetRetentionWindow makes a retention pick read n rows; it returns a
// function that restores the default.
func SetRetentionWindow(n int) (restore func()) {
	old := retentionWindow
	retentionWindow = n
	return func() { retentionWindow = old }
}

// PartitionLockOf is the advisory lock key of a group's partition.
func PartitionLockOf(group, topic string, partition int32) int64 {
	return partitionLockOf(group, topic, partition)
}

// SetAfterRetentionPick calls f with the phase ("versions", "side") after
// each retention pick, before the chunk's lock; it returns a function
// that removes it.
func SetAfterRetentionPick(f func(phase string)) (restore func()) {
	afterRetentionPick = f
	return func() { afterRetentionPick = nil }
}
