package consumer

import (
	"context"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
)

// The completeness watermark (sink/watermark.go) needs, besides the valid
// time of what each batch applied, looks at the logs' ends: a partition
// whose recorded offset had reached the end at a look is complete through
// that look's time, less the reorder window, even when nothing new comes.
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
		if err := c.lookAtEnds(ctx, adm); err != nil && ctx.Err() == nil && time.Since(warned) > 30*time.Second {
			warned = time.Now()
			c.log.Warn("looking at the logs' ends for the completeness watermark failed; it lags meanwhile", zap.Error(err))
		}
	}
}

func (c *Consumer) lookAtEnds(ctx context.Context, adm *kadm.Client) error {
	c.mu.Lock()
	from := make(map[change.Partition]int64, len(c.assigned))
	unknown := false
	for p := range c.assigned {
		o, ok := c.origin[p]
		if !ok {
			o, unknown = -1, true // a new group's partition not read yet
		}
		from[p] = o
	}
	c.mu.Unlock()
	if len(from) == 0 {
		return nil
	}
	var topics []string
	seen := map[string]bool{}
	for p := range from {
		if !seen[p.Topic] {
			seen[p.Topic] = true
			topics = append(topics, p.Topic)
		}
	}
	lctx, cancel := context.WithTimeout(ctx, 5*watermarkEvery)
	defer cancel()
	at := time.Now() // before asking: the end seen is at least the end at this time
	ends, err := adm.ListEndOffsets(lctx, topics...)
	if err != nil {
		return err
	}
	var starts kadm.ListedOffsets
	if unknown {
		if starts, err = adm.ListStartOffsets(lctx, topics...); err != nil {
			return err
		}
	}
	looks := make(map[change.Partition]sink.Look, len(from))
	for p, o := range from {
		e, ok := ends.Lookup(p.Topic, p.Partition)
		if !ok || e.Err != nil {
			continue
		}
		if o < 0 {
			// Not read yet: an empty log has nothing to apply; any other
			// waits for its first records to place it.
			if s, ok := starts.Lookup(p.Topic, p.Partition); !ok || s.Err != nil || s.Offset != e.Offset {
				continue
			}
			o = e.Offset
		}
		looks[p] = sink.Look{Target: c.target(p.Topic), From: o, End: e.Offset, At: at}
	}
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
