package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Rebalance discipline (DESIGN.md section 6): a rebalance never waits on
// anything unbounded, and a member that lost its partitions applies
// nothing more from them.
//
//   - The poll loop stops handing batches over when a rebalance waits, and
//     waits for the applier at most revokeBudget. A batch still retrying
//     then (PostgreSQL down, a table locked) is abandoned: its transaction
//     is cancelled and rolls back, and the records of every batch not
//     applied are read again from the last applied offsets (resync). The
//     revoke callback likewise gives up after revokeBudget and leaves the
//     revoked partitions to their next owner.
//   - Every batch's transaction confirms, just before it commits, that this
//     member still belongs to the group's generation (a Heartbeat with the
//     member's ID and generation): a member expelled while stopped or cut
//     off — its session expired, its partitions given to another — rolls
//     back instead of committing a stale batch, and reads its (new)
//     partitions again.
//   - Registry lookups and a snapshot's bookkeeping are bounded per poll
//     (decodeBudget); a partition that has to wait is paused and read
//     again later, so the poll loop reaches the rebalance in time.
//   - scd2sink_offsets never moves backwards (the sink keeps the higher
//     offset for one topic ID).

// defaultRevokeBudget bounds how long a rebalance waits for batches in
// flight (Config.revokeBudget).
const defaultRevokeBudget = 10 * time.Second

// errRebalance: a batch was not handed over because a rebalance waits.
var errRebalance = errors.New("a rebalance is waiting")

// errNotMember: the group no longer counts this member in the generation
// it applied under; the batch was rolled back.
var errNotMember = errors.New("this member is no longer in the consumer group's generation (its session expired or it was fenced); the batch was rolled back")

// kafkaUnsure wraps a failure to confirm membership (the coordinator
// unreachable, moving): retried like a PostgreSQL outage.
type kafkaUnsure struct{ err error }

func (e kafkaUnsure) Error() string {
	return fmt.Sprintf("confirming group membership before commit: %v", e.err)
}
func (e kafkaUnsure) Unwrap() error { return e.err }

// confirmMember asks the group coordinator whether this member still
// belongs to the generation it joined. It is called in each batch's
// transaction just before it commits.
func (c *Consumer) confirmMember(ctx context.Context) error {
	member, gen := c.client.GroupMetadata()
	if member == "" || gen < 0 {
		return errNotMember
	}
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group = c.cfg.GroupID
	req.MemberID = member
	req.Generation = gen
	if c.cfg.InstanceID != "" {
		req.InstanceID = &c.cfg.InstanceID
	}
	// The transaction idles meanwhile: well within the session timeout,
	// which is PostgreSQL's idle_in_transaction_session_timeout too.
	limit := 10 * time.Second
	if c.cfg.SessionTimeout > 0 {
		limit = min(limit, c.cfg.SessionTimeout/2)
	}
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	resp, err := req.RequestWith(cctx, c.client)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	switch {
	case err == nil, errors.Is(err, kerr.RebalanceInProgress):
		// Still a member; in a rebalance the revoke waits for this batch.
		return nil
	case errors.Is(err, kerr.UnknownMemberID), errors.Is(err, kerr.IllegalGeneration), errors.Is(err, kerr.FencedInstanceID):
		return fmt.Errorf("%w: %v", errNotMember, err)
	default:
		return kafkaUnsure{err}
	}
}

// noteApplied records, after a batch committed, the offsets it applied:
// where a resync reads again from. Called by the applier.
func (c *Consumer) noteApplied(j job) {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	if c.appliedTo == nil {
		c.appliedTo = map[change.Partition]int64{}
	}
	for p, o := range j.offsets {
		if _, back := c.rewound[p]; back && !j.rewound[p] {
			continue // cut before the partition was placed back
		}
		if o > c.appliedTo[p] || j.rewound[p] {
			c.appliedTo[p] = o
		}
	}
	for p := range j.rewound {
		// Only a partition whose offsets the batch recorded: a parked
		// target's are left out of it (park.go).
		if o, recorded := j.offsets[p]; !recorded {
			continue
		} else if placed, ok := c.rewound[p]; ok && o >= placed {
			delete(c.rewound, p) // recorded: from here on offsets only grow
		}
	}
}

// rewoundIn returns which of offsets' partitions were rewound on purpose
// and not yet recorded (nil: none).
func (c *Consumer) rewoundIn(offsets map[change.Partition]int64) map[change.Partition]bool {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	var out map[change.Partition]bool
	for p := range offsets {
		if _, ok := c.rewound[p]; ok {
			if out == nil {
				out = map[change.Partition]bool{}
			}
			out[p] = true
		}
	}
	return out
}

// requestResync makes the poll loop abandon every batch not yet applied
// and read their records again (resync) before it takes anything more.
func (c *Consumer) requestResync(why string) {
	if c.resyncWhy.CompareAndSwap(nil, &why) {
		c.applier.abandon()
	}
}

// resync abandons what is in flight and rewinds every partition still
// assigned to the offset its last applied batch recorded (or where its
// reading began): nothing that was not applied is skipped, nothing
// abandoned is applied. It runs on the poll loop (SetOffsets), while no
// rebalance callback runs.
func (c *Consumer) resync(ctx context.Context) error {
	p := c.resyncWhy.Load()
	if p == nil {
		return nil
	}
	c.applier.abandon()
	if err := c.applier.waitCtx(ctx); err != nil {
		return err // shutting down; or the applier failed before
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commitMu.Lock()
	targets := map[change.Partition]int64{}
	for part, o := range c.origin {
		targets[part] = o
		if a, ok := c.appliedTo[part]; ok && a > o {
			targets[part] = a
		}
	}
	c.commitMu.Unlock()
	parts := make([]change.Partition, 0, len(targets))
	for part := range targets {
		parts = append(parts, part)
	}
	seeds := c.anchors.At(targets)
	c.seq.DropPartitions(parts)
	c.anchors.Drop(parts)
	for part, o := range targets {
		if seeds[part] != nil {
			c.anchors.Resume(part, o, seeds[part])
		}
		c.next[part] = o
	}
	c.pending, c.pendBytes, c.dead, c.snaps, c.lost = nil, 0, nil, nil, nil
	c.noteBuffer()
	c.seekTo(targets)
	c.ledger.Forget()
	c.resyncWhy.Store(nil)
	c.log.Warn("batches not applied were abandoned; reading their records again from the last applied offsets",
		zap.String("why", *p), zap.Any("from", targets))
	return nil
}

// seekTo makes the next fetches of the given partitions start at the given
// offsets. Only on the poll loop, while no rebalance callback runs.
func (c *Consumer) seekTo(at map[change.Partition]int64) {
	if len(at) == 0 {
		return
	}
	seek := map[string]map[int32]kgo.EpochOffset{}
	for p, o := range at {
		if seek[p.Topic] == nil {
			seek[p.Topic] = map[int32]kgo.EpochOffset{}
		}
		seek[p.Topic][p.Partition] = kgo.EpochOffset{Epoch: -1, Offset: o}
	}
	c.client.SetOffsets(seek)
}
