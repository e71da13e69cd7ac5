package status

import (
	"context"
	"fmt"
	"html/template"
	"strings"
	"time"
)

// Charts keep, per target, a point every SampleEvery for ChartSpan: the
// records applied so far (the sum of its partitions' offsets in
// PostgreSQL) and the records not applied yet. What the process keeps is
// bounded: ChartSpan/SampleEvery points per target.
const (
	ChartSpan   = 15 * time.Minute
	SampleEvery = 10 * time.Second
)

type point struct {
	at      time.Time
	applied int64 // records applied (offsets), for the rate
	lag     int64
}

// series is a target's points, oldest first.
type series struct{ points []point }

func (s *series) add(p point) {
	s.points = append(s.points, p)
	cut := 0
	for cut < len(s.points) && p.at.Sub(s.points[cut].at) > ChartSpan {
		cut++
	}
	s.points = append(s.points[:0], s.points[cut:]...)
}

// chart is what the page draws of a series: applied events/s between
// points, and the lag at each point.
type chart struct {
	at   []time.Time
	rate []float64
	lag  []float64
}

func (s *series) chart() chart {
	var c chart
	for i := 1; i < len(s.points); i++ {
		a, b := s.points[i-1], s.points[i]
		dt := b.at.Sub(a.at).Seconds()
		if dt <= 0 {
			continue
		}
		c.at = append(c.at, b.at)
		c.rate = append(c.rate, max(float64(b.applied-a.applied), 0)/dt)
		c.lag = append(c.lag, float64(b.lag))
	}
	return c
}

// Run samples every target's progress every Options.SampleEvery for the
// charts until ctx ends. A sample that cannot be read is skipped.
func (c *Collector) Run(ctx context.Context) error {
	t := time.NewTicker(c.opts.SampleEvery)
	defer t.Stop()
	for {
		c.sample(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// sample adds a point to each target's series: offsets from PostgreSQL,
// ends from Kafka (no counts: a sample is cheap).
func (c *Collector) sample(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	pg, err := c.readPostgres(ctx, true)
	if err != nil {
		return
	}
	targets := c.targets(pg.appliedTopics)
	var topics []string
	for _, t := range targets {
		topics = append(topics, t.Topics...)
	}
	ks, err := c.readOffsets(ctx, topics)
	if err != nil {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range targets {
		var applied, lag int64
		for _, topic := range t.Topics {
			for p, end := range ks.ends[topic] {
				next, ok := pg.offsets[topic][p]
				if !ok {
					next = ks.starts[topic][p]
				}
				applied += next
				lag += max(end-next, 0)
			}
		}
		s := c.charts[t.Target]
		if s == nil {
			s = &series{}
			c.charts[t.Target] = s
		}
		s.add(point{at: now, applied: applied, lag: lag})
	}
}

// svg draws values as a small line chart over at most ChartSpan, with
// its latest value and its peak; nothing but numbers goes into it.
func svg(title, unit string, at []time.Time, values []float64, now time.Time) template.HTML {
	const w, h = 240.0, 48.0
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img" aria-label="%s">`, w, h+14, w, h+14, template.HTMLEscapeString(title))
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%.0f" height="%.0f" class="frame"/>`, w, h)
	if len(values) == 0 {
		fmt.Fprintf(&b, `<text x="4" y="%.0f">%s: no samples yet</text></svg>`, h+12, template.HTMLEscapeString(title))
		return template.HTML(b.String())
	}
	peak := 0.0
	for _, v := range values {
		peak = max(peak, v)
	}
	scale := 1.0
	if peak > 0 {
		scale = (h - 4) / peak
	}
	// The x axis spans the samples kept (at least a minute): a process
	// that just started draws its first minutes across the chart.
	span := min(max(now.Sub(at[0]), time.Minute), ChartSpan).Seconds()
	var pts []string
	for i, v := range values {
		x := w - now.Sub(at[i]).Seconds()/span*w
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", max(x, 0), h-2-v*scale))
	}
	fmt.Fprintf(&b, `<polyline points="%s" class="line"/>`, strings.Join(pts, " "))
	fmt.Fprintf(&b, `<text x="4" y="%.0f">%s: %s %s (peak %s)</text></svg>`, h+12, template.HTMLEscapeString(title),
		human(values[len(values)-1]), unit, human(peak))
	return template.HTML(b.String())
}

// human writes v with at most one decimal and a k or M suffix.
func human(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 100 || v == float64(int64(v)):
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
