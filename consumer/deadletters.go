package consumer

import (
	"sync"
	"time"

	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
)

// Dead letters are logged (DESIGN.md section 7): each one at warn with its
// topic, partition, offset, target, reason and error, once the transaction
// that wrote it has committed — at most deadLogBurst per deadLogWindow, so
// that a flood of bad records cannot flood the log; the number left out is
// logged with the next window's first line (and every dead letter is
// counted in scd2sink_events_dead_lettered_total{target,reason} and kept in
// the dead-letter table, whatever the log shows).
const (
	deadLogBurst  = 20
	deadLogWindow = time.Minute
)

// deadLog rate-limits the dead-letter log lines: at most burst lines per
// window (0: deadLogBurst, deadLogWindow; tests shorten them).
type deadLog struct {
	burst   int
	window  time.Duration
	mu      sync.Mutex
	start   time.Time // the current window's start
	logged  int       // lines in the current window
	skipped int       // dead letters not logged since the last line
}

// log logs notes, as many as the rate allows.
func (d *deadLog) log(l *zap.Logger, notes []sink.DeadNote) {
	if len(notes) == 0 || l == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range notes {
		fields, ok := d.allow(zap.String("topic", n.Origin.Topic), zap.Int32("partition", n.Origin.Partition.Partition),
			zap.Int64("offset", n.Origin.Offset), zap.String("target", n.Table), zap.String("reason", n.Reason), zap.String("error", n.Err))
		if ok {
			l.Warn("event dead-lettered: it is kept in the dead-letter table (scd2sink dead-letters list); put the cause right and replay it", fields...)
		}
	}
}

// allow says whether a line may be logged now, adding to its fields the
// count of lines left out before it. Called with d.mu held.
func (d *deadLog) allow(fields ...zap.Field) ([]zap.Field, bool) {
	burst, window := d.burst, d.window
	if burst <= 0 {
		burst = deadLogBurst
	}
	if window <= 0 {
		window = deadLogWindow
	}
	if now := time.Now(); now.Sub(d.start) >= window {
		d.start, d.logged = now, 0
	}
	if d.logged >= burst {
		d.skipped++
		return nil, false
	}
	d.logged++
	if d.skipped > 0 {
		fields = append(fields, zap.Int("not_logged_before", d.skipped))
		d.skipped = 0
	}
	return fields, true
}

// logDisagreements logs late events that their sequence and their valid
// time place on different sides of an applied event, at the same rate as
// dead letters (and with their own window).
func (d *deadLog) logDisagreements(l *zap.Logger, notes []sink.Disagreement) {
	if len(notes) == 0 || l == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range notes {
		fields, ok := d.allow(zap.String("topic", n.Origin.Topic), zap.Int32("partition", n.Origin.Partition.Partition),
			zap.Int64("offset", n.Origin.Offset), zap.String("target", n.Table),
			zap.Stringer("sequence", n.Seq), zap.Time("valid_time", n.T), zap.Stringer("later_sequence", n.Later), zap.Time("later_valid_time", n.LaterT))
		if ok {
			l.Warn("late event: its sequence puts it before an applied event with an earlier valid time; the history follows the sequence. "+
				"if the sequence ran backwards (binlog positions after a failover), see docs/sources.md", fields...)
		}
	}
}

// logExpired logs events dropped because their whole effect lies before
// the retention horizon (scd2sink_events_expired_total), at the same rate
// as dead letters (and with their own window).
func (d *deadLog) logExpired(l *zap.Logger, notes []sink.DeadNote) {
	if len(notes) == 0 || l == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range notes {
		fields, ok := d.allow(zap.String("topic", n.Origin.Topic), zap.Int32("partition", n.Origin.Partition.Partition),
			zap.Int64("offset", n.Origin.Offset), zap.String("target", n.Table), zap.String("why", n.Err))
		if ok {
			l.Info("event before the retention horizon dropped: what it would change is gone (counted in scd2sink_events_expired_total)", fields...)
		}
	}
}
