package consumer

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/plugin/kprom"
)

// Metrics are the pipeline's Prometheus metrics (DESIGN.md section 8).
type Metrics struct {
	Consumed       *prometheus.CounterVec
	Applied        prometheus.Counter
	DeadLettered   *prometheus.CounterVec // by target and reason (sink.Reason*)
	VersionsOpened prometheus.Counter
	VersionsClosed prometheus.Counter
	Repaired       prometheus.Counter
	RepairRead     *prometheus.CounterVec
	Duplicates     prometheus.Counter
	TypeMismatch   prometheus.Counter
	Rejected       prometheus.Counter
	Buffered       prometheus.Gauge
	BufferedBytes  prometheus.Gauge
	ReleasedEarly  prometheus.Counter
	// ReleasedQuiet counts events released before their window ended
	// because their table's input was quiet (quiet.go).
	ReleasedQuiet prometheus.Counter
	Paused        prometheus.Gauge
	ApplySeconds  prometheus.Histogram
	Lag           *prometheus.GaugeVec
	// Retries counts PostgreSQL errors retried, by SQLSTATE ("network"
	// without one, "drift" for a history table changed by hand).
	Retries *prometheus.CounterVec
	// OffsetsLost counts partitions whose next offset was no longer in the
	// log (retention, a re-created topic, data lost by the broker), by topic.
	OffsetsLost *prometheus.CounterVec
	// OffsetsDiffer counts assigned partitions whose offset in
	// scd2sink_offsets differed from Kafka's committed one, by topic and
	// direction: ahead (a crash before the Kafka commit), behind (the
	// target restored from a backup: read again) or missing (none in
	// scd2sink_offsets while the history table exists).
	OffsetsDiffer *prometheus.CounterVec
	// WatermarkLag is, per target, how far its completeness watermark
	// trails the clock.
	WatermarkLag *prometheus.GaugeVec
	// TransactionsGivenUp counts, per transaction topic, the source
	// transactions given up while still missing events (consumer/txlog).
	TransactionsGivenUp *prometheus.CounterVec
	// TopicsSkipped counts topics matched by a subscription that cannot be
	// applied (two patterns, a target taken), by topic.
	TopicsSkipped *prometheus.CounterVec
	// FetchMaxBytes is the fetch size asked of Kafka now: smaller than its
	// default when batches are compressed (fetchsize.go).
	FetchMaxBytes prometheus.Gauge
	// TargetBlocked is 1 while a target is parked (park.go), 0 after.
	TargetBlocked *prometheus.GaugeVec
	// TargetApplied is, per target, the Unix time its last batch part
	// committed: time() minus it is the seconds since its last apply.
	TargetApplied *prometheus.GaugeVec
	// Disagreements counts late events whose valid time is after that of
	// an applied event their sequence puts after them, by target.
	Disagreements *prometheus.CounterVec
	// Streams counts a topic's events in a GTID stream (MariaDB domain,
	// MySQL source uuid) other than those seen before, by topic.
	Streams *prometheus.CounterVec
	// ErasedDropped counts events (and dead letters) of erased keys
	// dropped instead of stored, by target (DESIGN.md section 12).
	ErasedDropped *prometheus.CounterVec
	// RetentionRemoved counts the versions (table="history"), side rows
	// (table="side") and emptied partitions (table="partitions") retention
	// removed, by target.
	RetentionRemoved *prometheus.CounterVec
	// RetentionHorizon is, per target, the Unix time before which the
	// last retention pass removed closed versions.
	RetentionHorizon *prometheus.GaugeVec
	// RetentionFailures counts retention passes over a target that failed
	// (tried again at the next pass).
	RetentionFailures *prometheus.CounterVec
	// Expired counts, per target, events whose whole effect lies before
	// what retention kept of their key: dropped, never dead-lettered
	// (DESIGN.md section 12).
	Expired *prometheus.CounterVec
	// Kafka is franz-go's own client metrics, when registered.
	Kafka *kprom.Metrics
}

// NewMetrics creates the metrics and registers them with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Consumed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_events_consumed_total",
			Help: "Records read from Kafka."}, []string{"topic"}),
		Applied: prometheus.NewCounter(prometheus.CounterOpts{Name: "scd2sink_events_applied_total",
			Help: "Events folded into history tables."}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_events_dead_lettered_total",
			Help: "Records written to the dead-letter table, by target and reason (decode, conflict, type_mismatch, rejected, invalid, no_table)."},
			[]string{"target", "reason"}),
		VersionsOpened: prometheus.NewCounter(prometheus.CounterOpts{Name: "scd2sink_versions_opened_total",
			Help: "History versions opened."}),
		VersionsClosed: prometheus.NewCounter(prometheus.CounterOpts{Name: "scd2sink_versions_closed_total",
			Help: "History versions closed."}),
		Repaired: prometheus.NewCounter(prometheus.CounterOpts{Name: "scd2sink_late_events_repaired_total",
			Help: "Keys whose history was re-folded because of late or repeated events."}),
		RepairRead: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_repair_rows_read_total",
			Help: "Rows those repairs read: of the history table (table=\"history\") and of the side table (table=\"side\")."}, []string{"table"}),
		Duplicates: prometheus.NewCounter(prometheus.CounterOpts{Name: "scd2sink_duplicates_dropped_total",
			Help: "Events dropped as already applied."}),
		TypeMismatch: prometheus.NewCounter(prometheus.CounterOpts{Name: "scd2sink_type_mismatches_total",
			Help: "Events dead-lettered because a value no longer fits its history column's type (the source's type changed)."}),
		Rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "scd2sink_values_rejected_total",
			Help: "Events dead-lettered because PostgreSQL rejected a value (SQLSTATE class 22 or 23)."}),
		Buffered: prometheus.NewGauge(prometheus.GaugeOpts{Name: "scd2sink_buffered_events",
			Help: "Events waiting in the reorder buffer."}),
		BufferedBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "scd2sink_buffered_bytes",
			Help: "Estimated memory of the events in the reorder buffer (bounded by sequencer.max_buffered_bytes)."}),
		ReleasedEarly: prometheus.NewCounter(prometheus.CounterOpts{Name: "scd2sink_events_released_early_total",
			Help: "Events released before their reorder window ended because the buffer was over sequencer.max_buffered_bytes."}),
		ReleasedQuiet: prometheus.NewCounter(prometheus.CounterOpts{Name: "scd2sink_events_released_quiet_total",
			Help: "Events released before their reorder window ended because their table's partitions were read to their end and no record had come for sequencer.quiet_after."}),
		Paused: prometheus.NewGauge(prometheus.GaugeOpts{Name: "scd2sink_fetch_paused",
			Help: "1 while fetching is paused because the reorder buffer is full."}),
		ApplySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "scd2sink_batch_apply_seconds",
			Help: "Time to apply one batch in PostgreSQL, retries included.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "scd2sink_partition_lag",
			Help: "High watermark minus the committed offset, per partition."}, []string{"topic", "partition"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_retries_total",
			Help: "PostgreSQL errors retried (an outage, a lock timeout, a full disk, a failover, a missing privilege), by SQLSTATE."}, []string{"sqlstate"}),
		TransactionsGivenUp: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_transactions_given_up_total",
			Help: "Source transactions given up while still missing events, by transaction topic."}, []string{"topic"}),
		WatermarkLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "scd2sink_watermark_lag_seconds",
			Help: "How far the target's completeness watermark (scd2sink_watermarks) trails the clock."}, []string{"target"}),
		TopicsSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_topics_skipped_total",
			Help: "Topics matched by a subscription that cannot be applied (two patterns match, or their target is another topic's): paused."}, []string{"topic"}),
		FetchMaxBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "scd2sink_fetch_max_bytes",
			Help: "The fetch size asked of Kafka: 1 MiB, less when batches are compressed, so that a fetch holds about 1 MiB of records once decompressed."}),
		TargetBlocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "scd2sink_target_blocked",
			Help: "1 while a target is parked: one table's trouble (a lock or statement timeout, a table changed by hand, a missing privilege) pauses only its partitions."},
			[]string{"target"}),
		TargetApplied: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "scd2sink_target_last_applied_timestamp_seconds",
			Help: "Unix time of the last batch that committed events or offsets of the target; time() - this is the seconds since its last apply."},
			[]string{"target"}),
		OffsetsDiffer: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_offsets_differ_total",
			Help: "Assigned partitions whose scd2sink_offsets offset differed from Kafka's committed one (direction: ahead, behind, missing); the partition resumes from scd2sink_offsets."},
			[]string{"topic", "direction"}),
		Disagreements: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_sequence_disagreements_total",
			Help: "Late events whose valid time is after that of an applied event their sequence puts after them: the history follows the sequence; a sequence that runs backwards (binlog positions across a failover) needs another sequence_by (docs/sources.md)."},
			[]string{"target"}),
		Streams: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_sequence_streams_total",
			Help: "GTID streams (MariaDB domains, MySQL source uuids) a topic's events carried after its first: GTIDs of different streams do not order each other (docs/sources.md)."},
			[]string{"topic"}),
		ErasedDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_erased_events_dropped_total",
			Help: "Events and dead letters of keys erased with scd2sink erase, dropped instead of stored (a replay, a rebuild, a re-snapshot), by target."},
			[]string{"target"}),
		RetentionRemoved: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_retention_removed_total",
			Help: "Versions (table=history), side rows (table=side) and emptied partitions (table=partitions) removed by retention, by target."}, []string{"target", "table"}),
		RetentionHorizon: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "scd2sink_retention_horizon_timestamp_seconds",
			Help: "Unix time before which the last retention pass removed closed versions, by target."}, []string{"target"}),
		RetentionFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_retention_failures_total",
			Help: "Retention passes that failed and wait for the next pass, by target."}, []string{"target"}),
		Expired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_events_expired_total",
			Help: "Events whose whole effect lies before what retention kept of their key (a redelivery of what it removed, a late event whose version it would remove): dropped, never dead-lettered, by target."}, []string{"target"}),
		OffsetsLost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "scd2sink_offsets_lost_total",
			Help: "Partitions whose next offset was no longer in the log (retention passed it, the topic was re-created, the broker lost data), by topic."}, []string{"topic"}),
	}
	if reg != nil {
		reg.MustRegister(m.Consumed, m.Applied, m.DeadLettered, m.VersionsOpened, m.VersionsClosed, m.Repaired, m.RepairRead,
			m.Duplicates, m.TypeMismatch, m.Rejected, m.Buffered, m.BufferedBytes, m.ReleasedEarly, m.ReleasedQuiet, m.Paused, m.ApplySeconds, m.Lag, m.Retries, m.OffsetsLost, m.OffsetsDiffer, m.TargetBlocked, m.TargetApplied, m.TopicsSkipped, m.WatermarkLag, m.TransactionsGivenUp, m.FetchMaxBytes,
			m.Disagreements, m.Streams, m.ErasedDropped, m.RetentionRemoved, m.RetentionHorizon, m.RetentionFailures, m.Expired)
		m.Kafka = kprom.NewMetrics("scd2sink_kafka", kprom.Registerer(reg), kprom.Gatherer(prometheus.NewRegistry()))
	}
	return m
}

func (m *Metrics) record(r sink.Result) {
	m.Applied.Add(float64(r.Events))
	for _, d := range r.Dead {
		m.DeadLettered.WithLabelValues(d.Table, d.Reason).Inc()
	}
	m.VersionsOpened.Add(float64(r.VersionsOpened))
	m.VersionsClosed.Add(float64(r.VersionsClosed))
	m.Repaired.Add(float64(r.Repaired))
	m.RepairRead.WithLabelValues("history").Add(float64(r.RepairVersionsRead))
	m.RepairRead.WithLabelValues("side").Add(float64(r.RepairSideRowsRead))
	m.Duplicates.Add(float64(r.Duplicates))
	m.TypeMismatch.Add(float64(r.TypeMismatches))
	m.Rejected.Add(float64(r.Rejected))
	for t, n := range r.Disagreements {
		m.Disagreements.WithLabelValues(t).Add(float64(n))
	}
	for t, n := range r.Erased {
		m.ErasedDropped.WithLabelValues(t).Add(float64(n))
	}
	for t, n := range r.Expired {
		m.Expired.WithLabelValues(t).Add(float64(n))
	}
}

// Health is what /readyz reports: Kafka reachable, group joined, PostgreSQL
// reachable, and nothing waiting on a retry.
type Health struct {
	Kafka    atomic.Bool
	Joined   atomic.Bool
	Postgres atomic.Bool
	mu       sync.Mutex
	kafkaErr atomic.Value       // string: why Kafka is unreachable
	lastRead atomic.Int64       // when a broker last answered (Unix ns)
	waits    map[string]string  // stage -> what it waits for
	parked   map[string]Parking // target -> why it is parked
}

// Parking is why and since when a target is parked, as the status page
// shows it: a value-free summary of the error (sink.Summary).
type Parking struct {
	Reason string
	Since  time.Time
}

// Park records that target is parked (again) for reason; the time of
// the first parking is kept.
func (h *Health) Park(target, reason string, since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.parked == nil {
		h.parked = map[string]Parking{}
	}
	h.parked[target] = Parking{Reason: reason, Since: since}
}

// Unpark records that target's parking is over.
func (h *Health) Unpark(target string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.parked, target)
}

// Parked is a copy of the targets parked now.
func (h *Health) Parked() map[string]Parking {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.parked)
}

// Wait records what a stage of the pipeline (init, prepare, apply ...)
// waits for; "" clears it.
func (h *Health) Wait(stage, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if reason == "" {
		delete(h.waits, stage)
		return
	}
	if h.waits == nil {
		h.waits = map[string]string{}
	}
	h.waits[stage] = reason
}

// Waiting says what the pipeline waits for, "" when nothing.
func (h *Health) Waiting() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for stage, why := range h.waits {
		out = append(out, stage+": "+why)
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// NotReady says, in a line per side, what keeps the process from being
// ready: Kafka, the group, PostgreSQL, and what waits on a retry.
func (h *Health) NotReady() []string {
	var out []string
	if !h.Kafka.Load() {
		why := "Kafka unreachable"
		if e, ok := h.kafkaErr.Load().(string); ok && e != "" {
			why += ": " + e
		}
		out = append(out, why)
	}
	if !h.Joined.Load() {
		out = append(out, "consumer group not joined (no partitions assigned yet)")
	}
	if !h.Postgres.Load() {
		out = append(out, "PostgreSQL unreachable or not prepared yet")
	}
	if why := h.Waiting(); why != "" {
		out = append(out, "waiting: "+why)
	}
	return out
}

// OnBrokerConnect marks Kafka unreachable, with why, when a broker
// connection cannot be opened and no broker has answered for
// kafkaQuiet (a kgo hook): with every broker down no fetch fails, since
// none is sent; with one broker of several away (a rolling restart) the
// others still answer, and Kafka is reachable.
func (h *Health) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		return // reachable once it answers (OnBrokerRead)
	}
	h.kafkaErr.Store(fmt.Sprintf("cannot connect to broker %s: %v", net.JoinHostPort(meta.Host, fmt.Sprint(meta.Port)), unwrapDial(err)))
	if time.Since(time.Unix(0, h.lastRead.Load())) > kafkaQuiet {
		h.Kafka.Store(false)
	}
}

// OnBrokerRead marks Kafka reachable whenever a broker answers a request
// (a fetch, empty on an idle topic, a heartbeat: a kgo hook).
func (h *Health) OnBrokerRead(_ kgo.BrokerMetadata, _ int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	h.lastRead.Store(time.Now().UnixNano())
	if !h.Kafka.Load() {
		h.kafkaErr.Store("")
		h.Kafka.Store(true)
	}
}

// kafkaQuiet is how long no broker may answer before a failed connection
// marks Kafka unreachable: longer than a fetch's wait and a heartbeat's
// interval, so that a live cluster always answers within it.
const kafkaQuiet = 5 * time.Second

// unwrapDial is a dial error's cause (connection refused, no such host).
func unwrapDial(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// Ready reports whether Kafka and PostgreSQL are reachable, the group is
// joined and nothing waits on a retry.
func (h *Health) Ready() bool {
	return h.Kafka.Load() && h.Joined.Load() && h.Postgres.Load() && h.Waiting() == ""
}
