// Package consumer reads Debezium's topics with a franz-go consumer group,
// decodes records into change events, orders them through the sequencer,
// hands batches to the sink and commits to Kafka exactly the commit points
// that the sink's transaction made true.
//
// One goroutine (Run) owns the poll loop; the rebalance callbacks run beside
// it and take the same mutex, so the sequencer and the pending batch are
// only ever touched by one of them at a time. With BlockRebalanceOnPoll, a
// rebalance waits until the loop has handed over what it polled.
package consumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scd2sink/scd2sink/consumer/anchor"
	"github.com/scd2sink/scd2sink/consumer/fetch"
	"github.com/scd2sink/scd2sink/consumer/park"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sequencer"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/plugin/kzap"
	"go.uber.org/zap"
)

// Sink is what the consumer needs of the sink (package sink's *Sink):
// the batch path, the ledger of what was applied, and the completeness
// watermark, each used by other parts of the consumer.
type Sink interface {
	BatchSink
	Ledger
	Watermarks
}

// BatchSink applies batches. Prepare (the CPU-bound half) is called by the
// poll loop and ApplyPrepared by the applier goroutine, each from one
// goroutine, possibly at the same time; prepared batches are applied in
// the order they were prepared, each all-or-nothing; an error is returned
// classified (sink.Classify) and the consumer retries (retry).
type BatchSink interface {
	Prepare(ctx context.Context, b sink.Batch) (*sink.Prepared, error)
	ApplyPrepared(ctx context.Context, p *sink.Prepared) (sink.Result, error)
	// ApplyPart applies a part split off a prepared batch (a parked
	// target's probe, park.go) beside ApplyPrepared: its partitions are
	// disjoint from those of every batch applied meanwhile.
	ApplyPart(ctx context.Context, p *sink.Prepared) (sink.Result, error)
	// Reconcile decides the recorded snapshots that are ready, whoever
	// recorded them; called by the applying goroutine while idle.
	Reconcile(ctx context.Context) error
}

// Ledger is what the transactions recorded: read when partitions are
// assigned (rebalance.go), lowered when partitions are rewound on purpose
// (offsets.go). Forget is called on every rebalance, while nothing is
// being prepared or applied, when what the sink remembers may have gone
// stale.
type Ledger interface {
	// Offsets returns the offsets the group's transactions recorded: the
	// next offset to consume per partition.
	Offsets(ctx context.Context) (map[change.Partition]int64, error)
	// TopicIDs returns the Kafka topic IDs recorded with the offsets.
	TopicIDs(ctx context.Context) (map[change.Partition]string, error)
	// Anchors returns what Position.Anchor recorded with those offsets.
	Anchors(ctx context.Context) (map[change.Partition]change.Seq, error)
	// Rewind lowers recorded offsets to the given ones (never raises
	// them): partitions placed back on purpose (offsets.go).
	Rewind(ctx context.Context, to map[change.Partition]int64) error
	// HistoryTables reports which of the given targets' history tables
	// exist.
	HistoryTables(ctx context.Context, targets []string) (map[string]bool, error)
	// Forget empties what the sink remembers of what it wrote; safe from
	// any goroutine, a batch being applied meanwhile included (its memory
	// is then not kept either). It never waits.
	Forget()
}

// Watermarks is the completeness watermark (watermark.go): Watermark
// records looks at the logs' ends, Watermarks reads it per target, and
// Connectors returns the connector stream of each topic the looks
// recorded (sink.Look.Connector). Called by the watermark loop alone.
type Watermarks interface {
	Watermark(ctx context.Context, looks map[change.Partition]sink.Look) error
	Watermarks(ctx context.Context) (map[string]time.Time, error)
	Connectors(ctx context.Context) (map[string]string, error)
}

// Decoder turns Kafka records into change events. The poll loop calls it
// once per record, in offset order per partition; it returns
// debezium.ErrSkip for records with nothing to apply and another error for
// records that go to the dead-letter table. Events must not reference the
// record's buffers.
type Decoder interface {
	// Decode blocks while what it needs (a schema registry) is
	// unreachable; it returns an error wrapping debezium.ErrRetry when
	// ctx ends first: the record was neither decoded nor dead-lettered.
	Decode(ctx context.Context, o change.Origin, key, value []byte, headers ...debezium.Header) (*change.Event, error)
	// Target names the table a topic's events belong to ("" if none).
	Target(topic string) string
	// TransactionTopic names the transaction metadata topic of a topic's
	// table ("" if none).
	TransactionTopic(topic string) string
}

// Config configures a Consumer.
type Config struct {
	Brokers     []string
	GroupID     string
	ClientID    string
	StartOffset string // earliest | latest: where a group without offsets starts
	// OnOffsetLost is fail (the default, also for ""), earliest or latest:
	// what a next offset that is no longer in the log does (offsets.go).
	OnOffsetLost string
	// SessionTimeout is the group session timeout (0: franz-go's default).
	SessionTimeout time.Duration
	// IsolationLevel is read_committed (the default, also for "") or
	// read_uncommitted: whether records of aborted Kafka transactions
	// (Debezium's exactly-once source mode writes in transactions) are read.
	IsolationLevel string
	TLS            *tls.Config
	SASL           sasl.Mechanism
	// InstanceID is the static group membership ID (KIP-345); "" keeps
	// dynamic membership.
	InstanceID string
	// LeaveOnStop makes a static member leave the group when it stops
	// (run --leave-group: a scale-down), so that its partitions go to the
	// others at once instead of after the session timeout.
	LeaveOnStop bool
	// Rules name the topics and how to decode them.
	Rules []debezium.Rule
	// Patterns, when not empty, are regular expressions (anchored) of the
	// topics to consume as well as Rules' (topic_pattern): topics that
	// start to match are consumed within MetadataMaxAge. Exclude are
	// regular expressions of topics never consumed then.
	Patterns []string
	Exclude  []string
	// MetadataMaxAge is how often the topic list is refreshed (default
	// franz-go's, 5m).
	MetadataMaxAge time.Duration
	// Route reports why a topic cannot be applied (nil: it can; ErrIgnored:
	// one of Debezium's own, paused quietly; ErrUnsettled: not known yet,
	// paused and asked again every second): a topic matched by two
	// patterns, or whose target another topic writes. Its partitions are
	// paused, never committed past what was applied. It is called with
	// the consumer's lock held and must answer within a few seconds.
	Route func(ctx context.Context, topic string) error
	// Decoder decodes records (default: debezium.New(Rules, nil, Logger): JSON only).
	Decoder Decoder

	ReorderWindow time.Duration
	// QuietAfter is how long no record must come before a target whose
	// partitions are read to their end releases what waits (quiet.go): 0
	// for a quarter of ReorderWindow, at most 500ms; negative for never.
	QuietAfter        time.Duration
	MaxBufferedEvents int
	MaxBufferedBytes  int64
	BatchMaxEvents    int
	// BatchMaxBytes bounds, by Event.Size, the events waiting for or in
	// the applier: a batch is cut at a third of it (0: 64 MiB).
	BatchMaxBytes int64
	BatchMaxWait  time.Duration

	Logger  *zap.Logger
	Metrics *Metrics
	// Classify tells what to do about a sink error (default sink.Classify):
	// Transient and Blocked errors are retried for as long as they last.
	Classify func(error) sink.Class
	// Opts are extra franz-go options (tests).
	Opts []kgo.Opt
	// revokeBudget bounds how long a rebalance waits for batches in
	// flight (0: defaultRevokeBudget; tests shorten it, export_test.go).
	revokeBudget time.Duration
}

// Consumer is the Kafka side of the pipeline. Create it with New, run it with Run.
type Consumer struct {
	cfg    Config
	log    *zap.Logger
	client *kgo.Client
	// ready is closed once client is set (awaitClient).
	ready chan struct{}
	// batches, ledger and marks are the sink's parts this consumer uses;
	// sink is all of it (optional interfaces are asked of it).
	batches BatchSink
	ledger  Ledger
	marks   Watermarks
	sink    Sink
	dec     Decoder
	m       *Metrics
	health  *Health

	applier     *applier
	cancelApply context.CancelFunc
	stopBy      time.Time // when a drain's budget ends
	// rebalanceWanted is set when franz-go holds a rebalance back for us.
	rebalanceWanted atomic.Bool

	commitMu sync.Mutex // guards committed, lastCommit and hwm (the applier commits)
	mu       sync.Mutex // guards everything below
	seq      *sequencer.Sequencer
	early    int64 // the sequencer's ReleasedEarly already counted
	// quietCount is the sequencer's ReleasedQuiet already counted.
	quietCount int64
	// lastRecord is when the last poll that brought records returned;
	// looked are the logs' bounds the last watermark look listed (quiet.go).
	lastRecord time.Time
	looked     map[change.Partition]logBounds
	// snaps are the completed snapshots whose last read is pending, by
	// that event (snapshot.go).
	snaps      map[*change.Event]sink.Snapshot
	anchors    *anchor.Anchors
	pending    []*change.Event
	pendBytes  int64 // Event.Size of pending
	dead       []sink.DeadLetter
	since      time.Time                  // when the oldest pending item was fetched
	flushed    time.Time                  // when pending was last handed over (batch.go old)
	committed  map[change.Partition]int64 // last offsets committed to Kafka
	lastCommit time.Time
	hwm        map[change.Partition]int64
	// topicIDs are the assigned topics' Kafka IDs, recorded with offsets.
	topicIDs map[string]string
	// next is, per assigned partition, the offset the next fetch reads:
	// where the group resumed, then one past the last record taken.
	next map[change.Partition]int64
	// lost are partitions whose next offset was out of range in the last
	// poll; fatal is a stop decided in a callback (offsets.go).
	lost  []change.Partition
	fatal atomic.Pointer[error]
	// draining is set once a drain starts: a batch blocked on the
	// database (a table changed by hand, schema_changes: fail) is then
	// left for the next start instead of waited on until the budget ends.
	draining   atomic.Bool
	drainStart chan struct{} // closed when the drain starts: wakes a blocked retry
	// published is, per connector (connectorOf), the newest valid time
	// read from its topics (mu): what it had written to Kafka by then
	// (watermark.go).
	published map[string]time.Time
	// sources are the connectors' names (source.name) by topic (mu).
	sources map[string]string
	// assigned are the partitions assigned, whether or not their reading
	// position is known yet (mu).
	assigned map[change.Partition]bool
	// skipped are the topics paused because they cannot be applied (mu).
	skipped map[string]bool
	// unsettled are the topics paused until Route can answer (mu).
	unsettled map[string]bool
	// dataLoss holds partitions the broker truncated under the reader
	// (kgo.ErrDataLoss), with the offset franz-go went on from.
	dataLoss map[change.Partition]int64
	// origin is, per assigned partition, where its reading began; appliedTo
	// (guarded by commitMu) the offsets its last applied batch recorded;
	// resyncWhy is set when batches were abandoned (resync.go).
	origin    map[change.Partition]int64
	appliedTo map[change.Partition]int64
	resyncWhy atomic.Pointer[string]
	// rewound (guarded by commitMu) holds partitions placed below their
	// stored offset on purpose (offsets lost), with the offset placed, until
	// a batch recording it is applied: scd2sink_offsets takes it as is.
	rewound map[change.Partition]int64
	// deadLog logs dead letters at a bounded rate (deadletters.go).
	deadLog deadLog
	// disagreeLog logs sequence/time disagreements at the same rate.
	disagreeLog deadLog
	// expiredLog logs events dropped before the retention horizon at the
	// same rate.
	expiredLog deadLog
	// park holds the parked targets (park.go).
	park park.Parking
	// waitMu guards the partitions held back (waits.go).
	waitMu  sync.Mutex
	paused  map[change.Partition]pausedPart
	backoff map[change.Partition]time.Duration
}

// New builds the franz-go client; it does not connect until Run.
func New(cfg Config, s Sink, health *Health) (*Consumer, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.BatchMaxBytes <= 0 {
		cfg.BatchMaxBytes = 64 << 20
	}
	if cfg.Classify == nil {
		cfg.Classify = sink.Classify
	}
	if cfg.revokeBudget <= 0 {
		cfg.revokeBudget = defaultRevokeBudget
	}
	if health == nil {
		health = &Health{}
	}
	if cfg.Decoder == nil {
		cfg.Decoder = debezium.New(cfg.Rules, nil, cfg.Logger)
	}
	c := &Consumer{ready: make(chan struct{}), drainStart: make(chan struct{}), cfg: cfg, log: cfg.Logger, sink: s, batches: s, ledger: s, marks: s, dec: cfg.Decoder, m: cfg.Metrics, health: health,
		seq: sequencer.New(sequencer.Config{ReorderWindow: cfg.ReorderWindow,
			MaxBufferedEvents: cfg.MaxBufferedEvents, MaxBufferedBytes: cfg.MaxBufferedBytes}, time.Now),
		committed: map[change.Partition]int64{}, hwm: map[change.Partition]int64{}, anchors: anchor.New(),
		topicIDs: map[string]string{}, next: map[change.Partition]int64{},
		origin: map[change.Partition]int64{}, appliedTo: map[change.Partition]int64{}, rewound: map[change.Partition]int64{}, assigned: map[change.Partition]bool{},
		paused: map[change.Partition]pausedPart{}, backoff: map[change.Partition]time.Duration{}}
	c.applier = newApplier(c)
	if sk, ok := s.(interface{ SkipReconcile(func(string) bool) }); ok {
		sk.SkipReconcile(c.park.Parked) // a parked table's snapshots wait with it
	}
	topics := make([]string, 0, len(cfg.Rules))
	for _, r := range cfg.Rules {
		topics = append(topics, r.Topic)
	}
	startAt := kgo.NewOffset().AtStart()
	if cfg.StartOffset == "latest" {
		startAt = kgo.NewOffset().AtEnd()
	}
	pool := &fetch.DecompressPool{}
	sizer := fetch.NewSizer(cfg.Metrics.FetchMaxBytes, pool)
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.ConsumerGroup(cfg.GroupID),
		kgo.ConsumeStartOffset(startAt),
		// An offset out of range is never resolved silently: it comes back
		// as a fetch error and follows OnOffsetLost (offsets.go).
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchMaxWait(250 * time.Millisecond),
		kgo.FetchMaxBytes(fetch.Budget), // bounds what franz-go buffers ahead of the sequencer
		kgo.FetchMaxPartitionBytes(fetch.PartitionMax),
		kgo.WithHooks(sizer),                      // and so does this, for compressed batches
		kgo.WithHooks(health),                     // brokers reachable or not, for /readyz
		kgo.WithPools(pool, &fetch.RecordsPool{}), // compressed batches' bytes, every batch's records; take recycles them
		// A fetch per broker, up to four: a broker with nothing to send
		// holds its fetch for FetchMaxWait, which must not hold back the
		// others (TestIdleBrokersDoNotStallFetching). Four fetches of
		// fetch.Budget are what a single fetch of 4 MiB held before.
		kgo.MaxConcurrentFetches(fetch.MaxConcurrent),
		kgo.OnPartitionsAssigned(c.onAssigned),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		kgo.AdjustFetchOffsetsFn(c.adjustOffsets),
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { c.rebalanceWanted.Store(true) }),
		kgo.WithLogger(kzap.New(c.log.Named("kafka"), kzap.Level(kgo.LogLevelWarn))),
	}
	if len(cfg.Patterns) > 0 {
		subs := append([]string(nil), cfg.Patterns...)
		for _, t := range topics {
			subs = append(subs, "^"+regexp.QuoteMeta(t)+"$")
		}
		opts = append(opts, kgo.ConsumeRegex(), kgo.ConsumeTopics(subs...))
		if len(cfg.Exclude) > 0 {
			opts = append(opts, kgo.ConsumeExcludeTopics(cfg.Exclude...))
		}
	} else {
		opts = append(opts, kgo.ConsumeTopics(topics...))
	}
	if cfg.MetadataMaxAge > 0 {
		opts = append(opts, kgo.MetadataMaxAge(cfg.MetadataMaxAge), kgo.MetadataMinAge(min(cfg.MetadataMaxAge, 5*time.Second)))
	}
	if cfg.Metrics.Kafka != nil {
		opts = append(opts, kgo.WithHooks(cfg.Metrics.Kafka))
	}
	if cfg.IsolationLevel != "read_uncommitted" {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	// A transaction's commit or abort marker takes an offset of its own,
	// the log's last after a transactional producer's write (Debezium's
	// exactly-once source mode). Kept, it is skipped like a tombstone, so
	// the offset recorded passes it and a partition read to its end is
	// seen as caught up (the completeness watermark) and never re-read.
	opts = append(opts, kgo.KeepControlRecords())
	if cfg.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(cfg.TLS))
	}
	if cfg.SASL != nil {
		opts = append(opts, kgo.SASL(cfg.SASL))
	}
	if cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(cfg.InstanceID))
	}
	if cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(cfg.SessionTimeout),
			kgo.HeartbeatInterval(min(3*time.Second, cfg.SessionTimeout/3)))
	}
	opts = append(opts, cfg.Opts...)
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("creating Kafka client: %w", err)
	}
	c.client = client
	sizer.SetClient(client)
	close(c.ready)
	return c, nil
}

// awaitClient waits until New has set c.client: franz-go joins the group,
// and may call the rebalance callbacks, before NewClient returns. It
// reports false when ctx ends first.
func (c *Consumer) awaitClient(ctx context.Context) bool {
	select {
	case <-c.ready:
		return true
	case <-ctx.Done():
		return false
	}
}

// Run polls, sequences and applies until ctx ends, then drains: it applies
// everything it holds, commits, and leaves the group, within drainTimeout.
// It returns nil after a clean drain and an error if the sink fails
// permanently or the drain does not finish in time.
func (c *Consumer) Run(ctx context.Context, drainTimeout time.Duration) error {
	// Batches in flight finish even when ctx ends; drain bounds the wait.
	applyCtx, cancelApply := context.WithCancel(context.WithoutCancel(ctx))
	c.cancelApply = cancelApply
	defer cancelApply()
	go c.applier.run(applyCtx)
	wctx, stopWatermarks := context.WithCancel(ctx)
	defer stopWatermarks()
	go c.watchWatermarks(wctx)
	defer func() {
		closed := make(chan struct{})
		go func() {
			c.client.Close() // may run the revoke callback, which still applies
			c.applier.stop()
			close(closed)
		}()
		if ctx.Err() == nil {
			<-closed
			return
		}
		// Shutting down: Close waits, without a deadline, for a group join
		// still in progress (Kafka holds it until a crashed predecessor's
		// session expires). drain has applied, committed and tried to
		// leave; past the shutdown budget, stop without it.
		select {
		case <-closed:
		case <-time.After(max(time.Until(c.stopBy), 100*time.Millisecond)):
			c.log.Warn("the Kafka client did not close within the shutdown timeout (a group join was still waiting); stopping anyway")
		}
	}()
	started := time.Now()
	var lastWarn time.Time
	for {
		if ctx.Err() != nil {
			return c.drain(drainTimeout)
		}
		if !c.health.Joined.Load() && time.Since(started) > notJoinedWarnAfter && time.Since(lastWarn) > notJoinedWarnEvery {
			lastWarn = time.Now()
			c.log.Warn("not in the consumer group yet: Kafka unreachable, authentication failing, or a crashed member's session not expired",
				zap.Strings("brokers", c.cfg.Brokers), zap.String("group", c.cfg.GroupID), zap.Duration("waiting", time.Since(started).Round(time.Second)))
		}
		c.resumeDue()
		c.syncParked()
		if err := c.resync(ctx); err != nil {
			if ctx.Err() != nil {
				return c.drain(drainTimeout)
			}
			return err
		}
		c.mu.Lock()
		full := c.seq.Full()
		wait := c.pollWait()
		c.mu.Unlock()
		if full {
			// Back-pressure: fetch nothing until the buffer drains.
			c.m.Paused.Set(1)
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		} else {
			c.m.Paused.Set(0)
			pollCtx, cancel := context.WithTimeout(ctx, wait)
			fetches := c.client.PollRecords(pollCtx, c.cfg.BatchMaxEvents)
			cancel()
			if fetches.IsClientClosed() {
				return nil
			}
			c.take(ctx, fetches)
			if err := c.offsetsLost(ctx); err != nil {
				c.fatal.CompareAndSwap(nil, &err)
			}
		}
		if p := c.fatal.Load(); p != nil {
			// Stop without applying more; what was applied is committed
			// as the client closes (the revoke callback may run now).
			c.client.AllowRebalance()
			return *p
		}
		c.mu.Lock()
		err := c.maybeFlush(ctx, false)
		c.mu.Unlock()
		if errors.Is(err, errRebalance) {
			err = nil // the pending batch waits for after the rebalance
		}
		if err == nil {
			err = c.applier.err()
		}
		// Rebalance callbacks run only while nothing is in flight: wait for
		// the applier when a rebalance is waiting (at most revokeBudget),
		// else allow it when idle.
		if wanted := c.rebalanceWanted.Load(); wanted || c.applier.idle() {
			wctx, cancel := ctx, context.CancelFunc(func() {})
			if wanted {
				c.applier.cancelProbes() // a parked table's probe does not hold a rebalance
				wctx, cancel = context.WithTimeout(ctx, c.cfg.revokeBudget)
			}
			werr := c.applier.waitCtx(wctx)
			cancel()
			if ctx.Err() != nil {
				return c.drain(drainTimeout) // a batch still retrying: drain bounds it
			}
			if errors.Is(werr, context.DeadlineExceeded) {
				c.requestResync(fmt.Sprintf("a rebalance waited %s for a batch still retrying", c.cfg.revokeBudget))
				if werr = c.resync(ctx); werr != nil && ctx.Err() != nil {
					return c.drain(drainTimeout)
				}
			}
			if err == nil {
				err = werr
			}
			c.rebalanceWanted.Store(false)
			c.client.AllowRebalance()
		}
		if err != nil {
			if ctx.Err() != nil {
				return c.drain(drainTimeout)
			}
			return err
		}
	}
}

// How soon and how often Run warns while it has not joined the group.
var (
	notJoinedWarnAfter = 5 * time.Second
	notJoinedWarnEvery = 30 * time.Second
)

// pollWait is how long a poll may block: until the next buffered event is
// due or, for an idle applier, the pending batch becomes old; at most the
// batch wait. Called with mu held.
func (c *Consumer) pollWait() time.Duration {
	wait := c.cfg.BatchMaxWait
	if next, ok := c.seq.NextDeadline(); ok {
		if d := time.Until(next); d < wait {
			wait = d
		}
	}
	if len(c.pending)+len(c.dead) > 0 && c.applier.jobsIdle() {
		if d := time.Until(c.oldAt()); d < wait {
			wait = d // an idle applier takes the batch then (old)
		}
	}
	wait = c.quietWait(wait)
	if wait < 5*time.Millisecond {
		wait = 5 * time.Millisecond
	}
	return wait
}

// noteBuffer updates the reorder buffer's metrics. Called with mu held.
func (c *Consumer) noteBuffer() {
	c.m.Buffered.Set(float64(c.seq.Len()))
	c.m.BufferedBytes.Set(float64(c.seq.Bytes()))
	st := c.seq.Stats()
	if st.ReleasedEarly > c.early {
		c.m.ReleasedEarly.Add(float64(st.ReleasedEarly - c.early))
		c.early = st.ReleasedEarly
	}
	if st.ReleasedQuiet > c.quietCount {
		c.m.ReleasedQuiet.Add(float64(st.ReleasedQuiet - c.quietCount))
		c.quietCount = st.ReleasedQuiet
	}
}

func (c *Consumer) target(topic string) string {
	if c.dec == nil {
		return ""
	}
	return c.dec.Target(topic)
}

func (c *Consumer) addDead(d sink.DeadLetter) {
	if len(c.pending) == 0 && len(c.dead) == 0 {
		c.since = time.Now()
	}
	c.dead = append(c.dead, d)
}
