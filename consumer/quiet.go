package consumer

import (
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/twmb/franz-go/pkg/kadm"
)

// A reorder window makes every event wait for earlier events of its key
// that another partition, or a producer's retry, may still bring. When
// the input is quiet that wait protects nothing: every assigned partition
// has been read to the end its last fetch reported and no record has come
// for a while (quietAfter), so whatever is buffered is released at once
// (sequencer.ReleaseQuiet) instead of at the end of its window: the end
// of a backlog, or of a burst followed by silence, is visible in the
// history a moment after it is read. A stream that brings records more
// often than quietAfter is never quiet, and nothing changes for it; one
// that comes in bursts (Debezium polls the WAL) is quiet between them,
// and its events wait only for their burst. An earlier event that comes
// after all is repaired by the sink, as the byte budget's early releases
// are; the create of a primary-key change still waits for its old key.

// maxQuietAfter bounds quietAfter for long windows.
const maxQuietAfter = 500 * time.Millisecond

// quietAfter is how long no record must come before the input counts as
// quiet: Config.QuietAfter, by default a quarter of the reorder window,
// at most maxQuietAfter; 0 (never) without a window or when turned off.
func (c *Consumer) quietAfter() time.Duration {
	switch q := c.cfg.QuietAfter; {
	case q < 0 || c.cfg.ReorderWindow <= 0:
		return 0
	case q > 0:
		return q
	}
	return min(c.cfg.ReorderWindow/4, maxQuietAfter)
}

// quietTargets returns the targets whose input is quiet at now: no
// record has come for quietAfter, and every assigned partition of their
// topics has been read to its end. Each target reads one topic, and a
// key's events come from its target's topic only, so a topic that is
// behind (paused, parked, skipped, not fetched yet) holds back only its
// own target. Nil when nothing is buffered or records came lately.
// Called with mu held.
func (c *Consumer) quietTargets(now time.Time) map[string]bool {
	after := c.quietAfter()
	if after <= 0 || c.seq.Len() == 0 || c.lastRecord.IsZero() || now.Sub(c.lastRecord) < after {
		return nil
	}
	quiet := map[string]bool{} // by target: every partition seen so far read to its end
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	for p := range c.assigned {
		target := c.target(p.Topic)
		if ok, seen := quiet[target]; target != "" && (!seen || ok) {
			quiet[target] = c.readToEnd(p)
		}
	}
	for target, ok := range quiet {
		if !ok {
			delete(quiet, target)
		}
	}
	return quiet
}

// logBounds are a partition's first and next offsets at a look.
type logBounds struct{ start, end int64 }

// noteEnds keeps the logs' bounds a watermark look listed (watermark.go):
// a partition whose records no poll brought may have no high watermark of
// a fetch, and counts as read to its end when its log is empty.
func (c *Consumer) noteEnds(starts, ends kadm.ListedOffsets) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.looked == nil {
		c.looked = map[change.Partition]logBounds{}
	}
	ends.Each(func(e kadm.ListedOffset) {
		st, ok := starts.Lookup(e.Topic, e.Partition)
		if e.Err != nil || !ok || st.Err != nil {
			return
		}
		c.looked[change.Partition{Topic: e.Topic, Partition: e.Partition}] = logBounds{start: st.Offset, end: e.Offset}
	})
}

// readToEnd reports whether p has been read to its end: the high
// watermark its last fetch reported, or the end the last look listed,
// whichever is further. One with no known end, or none read of it and a
// log that is not empty, is not. Called with mu and commitMu held.
func (c *Consumer) readToEnd(p change.Partition) bool {
	hw, fetched := c.hwm[p]
	lb, looked := c.looked[p]
	if !fetched && !looked {
		return false
	}
	next, known := c.next[p]
	if !known {
		return looked && lb.start == lb.end && hw <= lb.end
	}
	return next >= max(hw, lb.end)
}

// quietWait shortens a poll's wait to the moment the input would turn
// quiet, when that is still ahead (never to a moment passed: a buffer held
// by a partition behind its end must not make the loop spin). Called with
// mu held.
func (c *Consumer) quietWait(wait time.Duration) time.Duration {
	after := c.quietAfter()
	if after <= 0 || c.seq.Len() == 0 || c.lastRecord.IsZero() {
		return wait
	}
	if d := time.Until(c.lastRecord.Add(after)); d > 0 && d < wait {
		return d
	}
	return wait
}
