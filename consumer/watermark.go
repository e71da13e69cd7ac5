package consumer

import (
	"context"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
)

// The completeness watermark (sink/watermark.go) needs, besides the valid
// time of what each batch applied, looks at the logs' ends: a partition
// whose recorded offset had reached the end at a look is complete through
// the time of that look, less the reorder window, even when nothing new
// comes. Not the look's clock time, though: a connector writes to Kafka a
// moment after its source committed (seconds, when a new table's topic is
// created), so a log's end says nothing of changes it has not written
// yet. The time taken is the newest valid time read from any topic of the
// same connector (source.name; before an event names it, the topic's
// prefix before the first dot): Debezium writes in commit order, so
// changes committed before it are in Kafka, up to what the reorder window
// covers. A connector with nothing read since this member started gives
// no time (a stalled connector must not let the watermark run on with
// the clock): its partitions count through their last applied event.
// watchWatermarks takes such a look every watermarkEvery, beside the poll
// loop (it never holds the consumer's lock while asking Kafka or
// PostgreSQL), and sets scd2sink_watermark_lag_seconds per target. A
// failed look is logged at most every 30 s and taken again at the next
// tick: the watermark then only lags.

// watermarkEvery is how often the logs' ends are looked at.
var watermarkEvery = time.Second

func (c *Consumer) watchWatermarks(ctx context.Context) {
	tick := time.NewTicker(watermarkEvery)
	defer tick.Stop()
	adm := kadm.NewClient(c.client)
	var warned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c.settle(ctx)
		if err := c.lookAtEnds(ctx, adm); err != nil && ctx.Err() == nil && time.Since(warned) > 30*time.Second {
			warned = time.Now()
			c.log.Warn("looking at the logs' ends for the completeness watermark failed; it lags meanwhile", zap.Error(err))
		}
	}
}

func (c *Consumer) lookAtEnds(ctx context.Context, adm *kadm.Client) error {
	// Before asking for the ends: what was read by now was in Kafka below
	// them.
	c.mu.Lock()
	seen := map[string]bool{}
	var topics []string
	for p := range c.assigned {
		if !seen[p.Topic] && !c.skipped[p.Topic] && !c.unsettled[p.Topic] {
			seen[p.Topic] = true
			topics = append(topics, p.Topic)
		}
	}
	// The time through which each topic's connector had written by now
	// (absent: nothing of it read since this member started).
	published := make(map[string]time.Time, len(topics))
	for _, topic := range topics {
		if v, ok := c.published[c.connectorOf(topic)]; ok {
			published[topic] = v
		}
	}
	c.mu.Unlock()
	if len(topics) == 0 {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, 5*watermarkEvery)
	defer cancel()
	at := time.Now() // before asking: the end seen is at least the end at this time
	starts, err := adm.ListStartOffsets(lctx, topics...)
	if err != nil {
		return err
	}
	ends, err := adm.ListEndOffsets(lctx, topics...)
	if err != nil {
		return err
	}
	// Every partition of the topics, this member's or not: one that nobody
	// has applied yet holds its target's watermark back.
	looks := map[change.Partition]sink.Look{}
	ends.Each(func(e kadm.ListedOffset) {
		st, ok := starts.Lookup(e.Topic, e.Partition)
		if e.Err != nil || !ok || st.Err != nil {
			return
		}
		var when *time.Time
		if v, ok := published[e.Topic]; ok {
			if v.After(at) {
				v = at
			}
			when = &v
		}
		if target := c.target(e.Topic); target != "" {
			looks[change.Partition{Topic: e.Topic, Partition: e.Partition}] = sink.Look{Target: target, Start: st.Offset, End: e.Offset, At: when}
		}
	})
	if err := c.sink.Watermark(lctx, looks); err != nil {
		return err
	}
	wm, err := c.sink.Watermarks(lctx)
	if err != nil {
		return err
	}
	now := time.Now()
	for target, t := range wm {
		c.m.WatermarkLag.WithLabelValues(target).Set(now.Sub(t).Seconds())
	}
	return nil
}

// connectorOf names the connector that writes topic: the source.name its
// events carry; before one was read, the longest connector name known that
// is the topic's prefix (Debezium names topics <topic.prefix>.<schema>.<table>,
// and a prefix may hold dots); else the topic's part before its first dot.
// Called with mu held.
func (c *Consumer) connectorOf(topic string) string {
	if name, ok := c.sources[topic]; ok {
		return name
	}
	best := ""
	for name := range c.published {
		if len(name) > len(best) && strings.HasPrefix(topic, name+".") {
			best = name
		}
	}
	if best != "" {
		return best
	}
	prefix, _, _ := strings.Cut(topic, ".")
	return prefix
}

// noteValid remembers the newest valid time read from a connector's
// topics, and which connector writes topic. Called with mu held.
func (c *Consumer) noteValid(topic, source string, v time.Time) {
	if source != "" && c.sources[topic] != source {
		if c.sources == nil {
			c.sources = map[string]string{}
		}
		c.sources[topic] = source
	}
	if v.IsZero() {
		return
	}
	if c.published == nil {
		c.published = map[string]time.Time{}
	}
	k := c.connectorOf(topic)
	if v.After(c.published[k]) {
		c.published[k] = v
	}
}
