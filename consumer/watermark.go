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
// same connector stream (publishedFor): Debezium writes in commit order,
// so changes committed before it are in Kafka, up to what the reorder
// window covers. A stream nothing was read from since this member started
// gives no time (a stalled connector must not let the watermark run on
// with the clock): its partitions count through their last applied event.
// The time is the one read by the previous look, not by this one: Kafka
// orders a producer's records only within a partition, and a record of
// one table sent before a later one of another (a retried produce
// request, a busy connector) may land after it; a look's worth of time
// (watermarkEvery) lets what was in flight land before its log's end is
// taken (TestWholeConnector once saw four tables' changes land later than
// a newer change of another table read within the reorder window).
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
	loaded := false
	var before map[string]time.Time // the times read by the previous look
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c.settle(ctx)
		if !loaded {
			loaded = c.loadConnectors(ctx)
		}
		var err error
		if before, err = c.lookAtEnds(ctx, adm, before); err != nil && ctx.Err() == nil && time.Since(warned) > 30*time.Second {
			warned = time.Now()
			c.log.Warn("looking at the logs' ends for the completeness watermark failed; it lags meanwhile", zap.Error(err))
		}
	}
}

// lookAtEnds records a look at the logs' ends of the assigned topics,
// taking for each topic the time its connector had written through as
// read by the previous look (before; absent: the topic's partitions are
// not counted as read to their end this time). It returns the times read
// now, for the next look.
func (c *Consumer) lookAtEnds(ctx context.Context, adm *kadm.Client, before map[string]time.Time) (map[string]time.Time, error) {
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
	ids, conns := make(map[string]string, len(topics)), make(map[string]string, len(topics))
	for _, topic := range topics {
		if v, ok := c.publishedFor(topic); ok {
			published[topic] = v
		}
		ids[topic], conns[topic] = c.topicIDs[topic], c.sources[topic]
	}
	c.mu.Unlock()
	if len(topics) == 0 {
		return published, nil
	}
	lctx, cancel := context.WithTimeout(ctx, 5*watermarkEvery)
	defer cancel()
	at := time.Now() // before asking: the end seen is at least the end at this time
	starts, err := adm.ListStartOffsets(lctx, topics...)
	if err != nil {
		return published, err
	}
	ends, err := adm.ListEndOffsets(lctx, topics...)
	if err != nil {
		return published, err
	}
	// Every partition of the topics, this member's or not: one that nobody
	// has applied yet holds its target's watermark back.
	looks := map[change.Partition]sink.Look{}
	// A topic with a partition not listed is left out whole: a target's
	// watermark is the minimum over every partition, and a partition
	// missing from it (offline, its leader away) must not leave a hole.
	failed := map[string]bool{}
	ends.Each(func(e kadm.ListedOffset) {
		if st, ok := starts.Lookup(e.Topic, e.Partition); e.Err != nil || !ok || st.Err != nil {
			failed[e.Topic] = true
		}
	})
	for _, topic := range topics {
		if _, ok := ends[topic]; !ok {
			failed[topic] = true
		}
	}
	c.noteEnds(starts, ends)
	ends.Each(func(e kadm.ListedOffset) {
		st, _ := starts.Lookup(e.Topic, e.Partition)
		if failed[e.Topic] {
			return
		}
		var when *time.Time
		if v, ok := before[e.Topic]; ok {
			if v.After(at) {
				v = at
			}
			when = &v
		}
		if target := c.target(e.Topic); target != "" {
			looks[change.Partition{Topic: e.Topic, Partition: e.Partition}] = sink.Look{Target: target, Start: st.Offset, End: e.Offset, At: when,
				TopicID: ids[e.Topic], Connector: conns[e.Topic], TransactionTopic: c.dec.TransactionTopic(e.Topic)}
		}
	})
	if err := c.marks.Watermark(lctx, looks); err != nil {
		return published, err
	}
	wm, err := c.marks.Watermarks(lctx)
	if err != nil {
		return published, err
	}
	now := time.Now()
	for target, t := range wm {
		c.m.WatermarkLag.WithLabelValues(target).Set(now.Sub(t).Seconds())
	}
	return published, nil
}

// publishedFor returns the time through which topic's connector had
// written by the last event read from it: the stream its events name
// (source.name and source.db, recorded in scd2sink_progress so that a
// restart knows it); for a topic nothing was read from yet, the streams
// of the longest connector name that prefixes the topic (Debezium names
// topics <topic.prefix>.<schema>.<table>, and a prefix may hold dots),
// the earliest of them. Unknown (false) when none of its streams was read
// since this member started. Called with mu held.
func (c *Consumer) publishedFor(topic string) (time.Time, bool) {
	if key, ok := c.sources[topic]; ok {
		v, ok := c.published[key]
		return v, ok
	}
	var best string
	var at time.Time
	found := false
	for key, v := range c.published {
		name, _, _ := strings.Cut(key, "/")
		if !strings.HasPrefix(topic, name+".") || len(name) < len(best) {
			continue
		}
		if len(name) > len(best) || !found || v.Before(at) {
			best, at, found = name, v, true
		}
	}
	return at, found
}

// noteValid remembers the newest valid time read from a connector's
// stream, and which stream topic belongs to. Called with mu held.
func (c *Consumer) noteValid(topic, source string, v time.Time) {
	if source == "" {
		source, _, _ = strings.Cut(topic, ".") // not Debezium's envelope: its prefix
	}
	if c.sources[topic] != source {
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
	if v.After(c.published[source]) {
		c.published[source] = v
	}
}

// loadConnectors learns which connector stream writes each topic from
// what earlier looks recorded, so that a restart tells a topic's
// connector before reading anything of it. It reports success.
func (c *Consumer) loadConnectors(ctx context.Context) bool {
	lctx, cancel := context.WithTimeout(ctx, 5*watermarkEvery)
	defer cancel()
	known, err := c.marks.Connectors(lctx)
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sources == nil {
		c.sources = map[string]string{}
	}
	for topic, conn := range known {
		if _, ok := c.sources[topic]; !ok {
			c.sources[topic] = conn
		}
	}
	return true
}
