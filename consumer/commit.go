package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Committing to Kafka, draining and leaving the group.

// commit commits offsets to Kafka. A failed commit loses nothing: the
// offsets are in scd2sink_offsets and the next flush commits them again.
func (c *Consumer) commit(ctx context.Context, offsets map[change.Partition]int64) {
	// A coordinator that does not answer must not hold commitMu (and with
	// it the poll loop) for long: the offsets are in scd2sink_offsets.
	ctx, cancel := context.WithTimeout(ctx, commitBudget)
	defer cancel()
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.lastCommit = time.Now()
	toCommit := map[string]map[int32]kgo.EpochOffset{}
	for p, o := range offsets {
		if c.committed[p] == o {
			continue
		}
		if toCommit[p.Topic] == nil {
			toCommit[p.Topic] = map[int32]kgo.EpochOffset{}
		}
		toCommit[p.Topic][p.Partition] = kgo.EpochOffset{Epoch: -1, Offset: o}
	}
	if len(toCommit) == 0 {
		return
	}
	var commitErr error
	c.client.CommitOffsetsSync(ctx, toCommit, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		commitErr = err
		if err == nil {
			commitErr = commitResponseErr(resp)
		}
	})
	if commitErr != nil {
		if errors.Is(commitErr, context.Canceled) || errors.Is(commitErr, context.DeadlineExceeded) {
			return // shutting down, abandoned, or Kafka slow: the next commit carries them
		}
		c.log.Warn("committing offsets to Kafka failed; they are safe in scd2sink_offsets", zap.Error(commitErr))
		return
	}
	for p, o := range offsets {
		c.committed[p] = o
		if hw, ok := c.hwm[p]; ok {
			c.m.Lag.WithLabelValues(p.Topic, fmt.Sprint(p.Partition)).Set(float64(max(hw-o, 0)))
		}
	}
}

// commitBudget bounds one commit to Kafka.
const commitBudget = 15 * time.Second

// drain applies and commits everything held, then leaves the group.
func (c *Consumer) drain(timeout time.Duration) error {
	c.stopBy = time.Now().Add(timeout)
	if c.draining.CompareAndSwap(false, true) && c.drainStart != nil {
		close(c.drainStart)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c.mu.Lock()
	if c.resyncWhy.Load() != nil || c.fatal.Load() != nil {
		// Batches were abandoned, or the service stops on an error: apply
		// nothing more; the next start reads again from what was applied.
		c.pending, c.dead = nil, nil
	} else {
		c.collect(c.seq.Flush())
	}
	errc := make(chan error, 1)
	go func() { errc <- c.flushAndWait(ctx) }()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		c.cancelApply() // give up on retries; the next start replays
		<-errc
		err = fmt.Errorf("batches still in flight after %s", timeout)
	}
	c.mu.Unlock()
	c.client.AllowRebalance()
	if !c.health.Joined.Load() {
		// Never assigned anything (a join still waiting): nothing to
		// commit, nothing to hand over; do not wait for the join.
		c.stopBy = time.Now()
		c.log.Info("stopped before joining the group")
		return err
	}
	if lerr := c.client.LeaveGroupContext(ctx); lerr != nil && err == nil {
		c.log.Warn("leaving the group", zap.Error(lerr))
	}
	if c.cfg.InstanceID != "" && c.cfg.LeaveOnStop {
		c.leaveStatic(ctx) // what was applied is recorded: the others go on from there
	}
	if err != nil {
		return fmt.Errorf("draining on shutdown: %w", err)
	}
	if c.cfg.InstanceID != "" && c.cfg.LeaveOnStop {
		return nil
	}
	if c.cfg.InstanceID != "" {
		// Static membership: Kafka keeps the member (and its partitions)
		// for the session timeout, so a restart takes them back at once.
		c.log.Info("drained; a static member stays in the group until its session times out",
			zap.String("instance_id", c.cfg.InstanceID))
		return nil
	}
	c.log.Info("drained and left the group")
	return nil
}

// leaveStatic removes this static member from the group by its instance
// ID (franz-go keeps a static member in the group, KIP-345): asked to
// leave (run --leave-group), its partitions go to the others at once.
func (c *Consumer) leaveStatic(ctx context.Context) {
	resp, err := kadm.NewClient(c.client).LeaveGroup(ctx, kadm.LeaveGroup(c.cfg.GroupID).
		InstanceIDs(c.cfg.InstanceID).Reason("scd2sink stopped with --leave-group"))
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		c.log.Warn("leaving the group as a static member failed; its partitions wait for the session timeout",
			zap.String("instance_id", c.cfg.InstanceID), zap.Error(err))
		return
	}
	c.log.Info("drained and left the group (--leave-group)", zap.String("instance_id", c.cfg.InstanceID))
}

func commitResponseErr(resp *kmsg.OffsetCommitResponse) error {
	if resp == nil {
		return nil
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err)
			}
		}
	}
	return nil
}
