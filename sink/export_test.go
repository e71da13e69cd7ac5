package sink

import "github.com/jackc/pgx/v5/pgxpool"

// Tuning is what a test may change of a Sink's sizes and hooks
// (tuning.go).
type Tuning = tuning

// Tune changes s's tuning; call it before s applies anything.
func (s *Sink) Tune(f func(*Tuning)) { f(&s.tune) }

// NewTuned is New with f applied to the new Sink's tuning (nil: none).
func NewTuned(cfg Config, pool *pgxpool.Pool, f func(*Tuning)) (*Sink, error) {
	s, err := New(cfg, pool)
	if err == nil && f != nil {
		f(&s.tune)
	}
	return s, err
}

// BoundedRepairs is how many of s's repairs have stopped at a boundary.
func (s *Sink) BoundedRepairs() int64 { return s.applier.BoundedRepairs() }

// SplitBatches is how many of s's batches have been applied in parts.
func (s *Sink) SplitBatches() int64 { return s.stats.splitBatches.Load() }

// PartitionLock is the advisory lock key the Sink's batches take for a
// partition of its consumer group (-1: the topic's, once resized).
func (s *Sink) PartitionLock(topic string, partition int32) int64 {
	return s.partitionLock(topic, partition)
}

// PartitionLockOf is the advisory lock key of a group's partition.
func PartitionLockOf(group, topic string, partition int32) int64 {
	return partitionLockOf(group, topic, partition)
}
