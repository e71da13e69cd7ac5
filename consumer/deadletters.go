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
var (
	deadLogBurst  = 20
	deadLogWindow = time.Minute
)

// deadLog rate-limits the dead-letter log lines.
type deadLog struct {
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
		if now := time.Now(); now.Sub(d.start) >= deadLogWindow {
			d.start, d.logged = now, 0
		}
		if d.logged >= deadLogBurst {
			d.skipped++
			continue
		}
		d.logged++
		fields := []zap.Field{zap.String("topic", n.Origin.Topic), zap.Int32("partition", n.Origin.Partition.Partition),
			zap.Int64("offset", n.Origin.Offset), zap.String("target", n.Table), zap.String("reason", n.Reason), zap.String("error", n.Err)}
		if d.skipped > 0 {
			fields = append(fields, zap.Int("not_logged_before", d.skipped))
			d.skipped = 0
		}
		l.Warn("event dead-lettered: it is kept in the dead-letter table (scd2sink dead-letters list); put the cause right and replay it", fields...)
	}
}
