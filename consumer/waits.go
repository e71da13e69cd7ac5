package consumer

import (
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"go.uber.org/zap"
)

// Partitions held back. A record that cannot be decoded yet — the schema
// registry unreachable, or not knowing a schema id within
// schema_registry.lookup_timeout (a follower behind) — or whose snapshot
// bookkeeping cannot be done (Kafka's offsets not listed) is not the
// record's fault: it is neither applied nor dead-lettered. Its partition
// is paused and read again from that record after a backoff, while the
// other partitions go on; its commit point stays below it. /readyz names
// what it waits for and scd2sink_retries_total{sqlstate="registry"}
// counts the tries. Each poll spends at most decodeBudget waiting, so the
// poll loop always comes back to a rebalance in time.

// decodeBudget bounds the waiting one poll's decoding may do.
var decodeBudget = 2 * time.Second

// Backoff of a partition held back.
var (
	holdBackMin = 200 * time.Millisecond
	holdBackMax = 5 * time.Second
)

// heldBack is where a partition is read again from, and why.
type heldBack struct {
	offset int64
	why    string
}

// pausedPart is a partition held back: resumed at until.
type pausedPart struct {
	until   time.Time
	backoff time.Duration
	why     string
}

// holdBack pauses and rewinds the partitions in held, and forgets the
// backoff of partitions whose records decoded. It runs on the poll loop
// (SetOffsets), before the records are taken.
func (c *Consumer) holdBack(held map[change.Partition]heldBack, ok []decoded) {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	for _, it := range ok {
		if _, h := held[it.o.Partition]; !h {
			delete(c.backoff, it.o.Partition)
		}
	}
	if len(held) > 0 {
		seek := map[change.Partition]int64{}
		pause := map[string][]int32{}
		for p, h := range held {
			seek[p] = h.offset
			pause[p.Topic] = append(pause[p.Topic], p.Partition)
			b := c.backoff[p]
			if b == 0 {
				b = holdBackMin
			}
			c.paused[p] = pausedPart{until: time.Now().Add(b), backoff: b, why: h.why}
			c.backoff[p] = min(2*b, holdBackMax)
			c.m.Retries.WithLabelValues("registry").Inc()
			c.log.Debug("partition held back", zap.String("topic", p.Topic), zap.Int32("partition", p.Partition),
				zap.Int64("offset", h.offset), zap.String("why", h.why))
		}
		c.client.PauseFetchPartitions(pause)
		c.seekTo(seek)
	}
	c.noteWaits()
}

// resumeDue resumes the held-back partitions whose backoff has passed.
func (c *Consumer) resumeDue() {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	resume := map[string][]int32{}
	for p, st := range c.paused {
		if time.Now().After(st.until) {
			delete(c.paused, p)
			if c.park.PausedFor(p) {
				continue // its table is parked: resumed with it (park.go)
			}
			resume[p.Topic] = append(resume[p.Topic], p.Partition)
		}
	}
	if len(resume) > 0 {
		c.client.ResumeFetchPartitions(resume)
	}
}

// releaseHeld forgets held-back partitions given up (revoked, lost) and
// resumes them, so that a later assignment fetches them.
func (c *Consumer) releaseHeld(parts []change.Partition) {
	c.waitMu.Lock()
	defer c.waitMu.Unlock()
	resume := map[string][]int32{}
	for _, p := range parts {
		if _, ok := c.paused[p]; ok {
			resume[p.Topic] = append(resume[p.Topic], p.Partition)
		}
		delete(c.paused, p)
		delete(c.backoff, p)
	}
	if len(resume) > 0 {
		c.client.ResumeFetchPartitions(resume)
	}
	c.noteWaits()
}

// noteWaits shows on /readyz what held-back partitions wait for. Called
// with waitMu held.
func (c *Consumer) noteWaits() {
	if len(c.backoff) == 0 {
		c.health.Wait("decode", "")
		return
	}
	var whys []string
	seen := map[string]bool{}
	for _, st := range c.paused {
		if !seen[st.why] {
			seen[st.why] = true
			whys = append(whys, st.why)
		}
	}
	if len(whys) == 0 {
		return // resumed, being read again: keep the last reason until one decodes
	}
	c.health.Wait("decode", "records wait, their partitions paused and read again: "+strings.Join(whys, "; "))
}
