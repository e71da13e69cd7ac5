// Package txlog reads Debezium's transaction metadata topics (DESIGN.md
// section 14) and records each END record in PostgreSQL, so that the
// completeness watermark never passes a source transaction whose events
// are not all applied.
//
// Invariants, and why the state kept is enough:
//   - The reader is not a member of the consumer group: it reads every
//     partition of each transaction topic from the position recorded in
//     PostgreSQL (Store.Record writes it in the transaction that records
//     the ENDs below it), so a restart, or another member, reads on from
//     exactly there; ENDs recorded twice (two members reading the same
//     topic) are skipped by Store.Record.
//   - A transaction topic met for the first time is read from its start
//     when the group had applied nothing yet when the service started
//     (a new deployment reads the data topics from their start too; the
//     answer is recorded before anything is applied, txns.Reads.Begin),
//     else from its end: transactions applied before had no marks, and
//     waiting for them would hold the watermark for nothing.
//   - What it read and could not record yet (PostgreSQL away, another
//     member holding the topic's lock) is kept and recorded again; while
//     too much waits it reads no further.
//   - It never stops the pipeline: failures are logged and retried. Until
//     every partition of its topic has an END recorded, the targets of
//     the topic have no complete_through.
package txlog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/txns"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// Store records what is read; sink/txns.Reads is the one. Its methods
// may be called from one goroutine at a time per topic.
type Store interface {
	// Positions gives each recorded partition's next offset (partition
	// -1: where the others start, txns.FromStart or txns.FromEnd), and
	// whether the group has applied anything yet.
	Positions(ctx context.Context, topic string) (map[int32]int64, bool, error)
	// Record writes ENDs and next offsets in one transaction
	// (txns.ErrBusy: another member holds the topic now).
	Record(ctx context.Context, topic string, ends []txns.End, next map[int32]int64) error
	// Started records the partitions read and where from.
	Started(ctx context.Context, topic string, next map[int32]int64) error
	// Maintain gives up what waited too long and prunes what is done
	// (sweep: marks no END names too).
	Maintain(ctx context.Context, topic string, sweep bool) ([]txns.GivenUp, error)
	// InFlight counts the transactions recorded and not yet pruned.
	InFlight(ctx context.Context, topic string) (int64, error)
}

// Decoder decodes a transaction metadata record.
type Decoder interface {
	TransactionRecord(ctx context.Context, value []byte, headers ...debezium.Header) (debezium.TxRecord, error)
}

// Config configures a Reader.
type Config struct {
	// Topics are the transaction topics to read.
	Topics []string
	// Awaited reports whether the data collection an END of topic names
	// is applied by this configuration.
	Awaited func(topic, collection string) bool
	// Client makes a Kafka client of the cluster with the options given.
	Client func(opts ...kgo.Opt) (*kgo.Client, error)
	// ID gives the id of a transaction as its events name it
	// (debezium.TransactionID for the topic's connector); nil keeps it.
	ID func(topic, id string) string
	// Every is how often what was read is recorded and the transactions
	// maintained (default one second).
	Every time.Duration
	// OnGivenUp, when set, is called for each transaction collection
	// given up.
	OnGivenUp func(topic string, g txns.GivenUp)
	Logger    *zap.Logger
}

// maxPending is how many ENDs may wait to be recorded before the reader
// stops reading.
const maxPending = 50000

// maxInFlight is how many transaction rows of a topic may be recorded and
// not yet complete before the reader pauses that topic: with the group
// far behind (a backlog) it would read every END ahead of the events,
// and each look at the transactions would cost PostgreSQL more.
const maxInFlight = 20000

// Reader reads the transaction topics.
type Reader struct {
	cfg   Config
	store Store
	dec   Decoder
	log   *zap.Logger
	// pending are the ENDs read and not recorded yet, next the offsets
	// read past, per topic.
	pending map[string][]txns.End
	next    map[string]map[int32]int64
	warned  map[string]time.Time
	swept   map[string]time.Time // per topic, the last sweep of marks no END names
	// lastCommit is each partition's last END's commit time read (zero
	// before the first: an undecodable END is held there).
	lastCommit map[change.Partition]time.Time
}

// New returns a Reader.
func New(cfg Config, store Store, dec Decoder) *Reader {
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Reader{cfg: cfg, store: store, dec: dec, log: cfg.Logger, pending: map[string][]txns.End{},
		next: map[string]map[int32]int64{}, warned: map[string]time.Time{}, swept: map[string]time.Time{},
		lastCommit: map[change.Partition]time.Time{}}
}

// AwaitedBy returns the Awaited of a configuration: an END's collection is
// awaited when the topic Debezium names after it (<prefix>.<collection>,
// the prefix being the transaction topic's name before its last dot) is
// one whose table names this transaction topic. resolve gives a topic's
// transaction topic (false: no table applies the topic).
func AwaitedBy(resolve func(topic string) (string, bool)) func(topic, collection string) bool {
	return func(topic, collection string) bool {
		i := strings.LastIndexByte(topic, '.')
		if i < 0 {
			return false
		}
		if txn, ok := resolve(topic[:i] + "." + collection); ok && txn == topic {
			return true
		}
		// Oracle's and Db2's topics leave out the catalog the collection
		// names first.
		if _, rest, ok := strings.Cut(collection, "."); ok && strings.Contains(rest, ".") {
			txn, ok := resolve(topic[:i] + "." + rest)
			return ok && txn == topic
		}
		return false
	}
}

// warn logs at most every 30 s per kind.
func (r *Reader) warn(kind, msg string, fields ...zap.Field) {
	if time.Since(r.warned[kind]) < 30*time.Second {
		return
	}
	r.warned[kind] = time.Now()
	r.log.Warn(msg, fields...)
}

// Run reads until ctx ends. A topic that cannot be started yet (missing,
// PostgreSQL away) is tried again, with backoff, while the others are read.
func (r *Reader) Run(ctx context.Context) error {
	if len(r.cfg.Topics) == 0 {
		return nil
	}
	cl, err := r.cfg.Client(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return fmt.Errorf("the transaction topics' client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	tick := time.NewTicker(r.cfg.Every)
	defer tick.Stop()
	todo := append([]string(nil), r.cfg.Topics...)
	var retryAt time.Time
	backoff := time.Second
	for ctx.Err() == nil {
		if len(todo) > 0 && !time.Now().Before(retryAt) {
			if todo = r.start(ctx, cl, adm, todo); len(todo) > 0 {
				retryAt = time.Now().Add(backoff)
				backoff = min(2*backoff, 5*time.Second)
			}
		}
		if len(todo) < len(r.cfg.Topics) && r.waiting() < maxPending {
			r.poll(ctx, cl)
			select {
			case <-tick.C:
			default:
				continue
			}
		} else {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
		r.flush(ctx, cl)
	}
	return nil
}

func (r *Reader) waiting() int {
	n := 0
	for _, p := range r.pending {
		n += len(p)
	}
	return n
}

// start starts reading the topics it can and returns the others.
func (r *Reader) start(ctx context.Context, cl *kgo.Client, adm *kadm.Client, topics []string) []string {
	var left []string
	for _, topic := range topics {
		offsets, err := r.offsets(ctx, adm, topic)
		if err != nil {
			if ctx.Err() == nil {
				r.warn("start "+topic, "cannot start reading a transaction topic yet; its tables have no complete_through meanwhile",
					zap.String("topic", topic), zap.Error(err))
			}
			left = append(left, topic)
			continue
		}
		cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets})
	}
	return left
}

// offsets returns where topic's partitions are read from, recorded.
func (r *Reader) offsets(ctx context.Context, adm *kadm.Client, topic string) (map[int32]kgo.Offset, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stored, applied, err := r.store.Positions(lctx, topic)
	if err != nil {
		return nil, err
	}
	starts, err := adm.ListStartOffsets(lctx, topic)
	if err != nil {
		return nil, err
	}
	ends, err := adm.ListEndOffsets(lctx, topic)
	if err != nil {
		return nil, err
	}
	if err := ends.Error(); len(ends[topic]) == 0 || errors.Is(err, kerr.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("topic %s does not exist (is provide.transaction.metadata=true set on the connector?)", topic)
	}
	// A partition not recorded yet is read from where Begin said (from
	// the end, without its answer, when the group applied something).
	fromEnd := applied
	if mode, ok := stored[-1]; ok {
		fromEnd = mode == txns.FromEnd
	}
	for p := range stored {
		if p >= 0 {
			fromEnd = false // a partition added since: all of it is new
		}
	}
	next := map[int32]int64{}
	var failed error
	ends.Each(func(e kadm.ListedOffset) {
		st, ok := starts.Lookup(e.Topic, e.Partition)
		switch {
		case e.Err != nil || !ok || st.Err != nil:
			failed = fmt.Errorf("listing the offsets of %s/%d: %v %v", e.Topic, e.Partition, e.Err, st.Err)
		case hasKey(stored, e.Partition):
			n := stored[e.Partition]
			if n < st.Offset {
				r.log.Warn("the transaction topic's retention deleted ENDs not read yet: their transactions are not waited for",
					zap.String("topic", topic), zap.Int32("partition", e.Partition), zap.Int64("recorded", n), zap.Int64("log_start", st.Offset))
				n = st.Offset
			}
			next[e.Partition] = n
		case fromEnd:
			next[e.Partition] = e.Offset
		default:
			next[e.Partition] = st.Offset
		}
	})
	if failed != nil {
		return nil, failed
	}
	if err := r.store.Started(lctx, topic, next); err != nil {
		return nil, err
	}
	out := make(map[int32]kgo.Offset, len(next))
	for p, n := range next {
		out[p] = kgo.NewOffset().At(n)
	}
	r.log.Info("reading a transaction topic", zap.String("topic", topic), zap.Int("partitions", len(out)),
		zap.Int("recorded", len(stored)), zap.Bool("new_partitions_from_end", fromEnd))
	return out, nil
}

func hasKey(m map[int32]int64, k int32) bool {
	_, ok := m[k]
	return ok
}

// poll reads what came within one tick.
func (r *Reader) poll(ctx context.Context, cl *kgo.Client) {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.Every)
	fetches := cl.PollFetches(pctx)
	cancel()
	for _, fe := range fetches.Errors() {
		if errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled) {
			continue
		}
		var loss *kgo.ErrDataLoss
		if errors.As(fe.Err, &loss) {
			r.log.Warn("the transaction topic lost ENDs not read yet (retention, or the topic re-created): their transactions are not waited for",
				zap.String("topic", fe.Topic), zap.Int32("partition", fe.Partition), zap.Error(fe.Err))
			continue
		}
		r.warn("fetch", "reading a transaction topic failed; retrying", zap.String("topic", fe.Topic), zap.Error(fe.Err))
	}
	fetches.EachRecord(func(rec *kgo.Record) {
		if r.next[rec.Topic] == nil {
			r.next[rec.Topic] = map[int32]int64{}
		}
		r.next[rec.Topic][rec.Partition] = rec.Offset + 1
		hs := make([]debezium.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			hs[i] = debezium.Header{Key: h.Key, Value: h.Value}
		}
		tr, err := r.dec.TransactionRecord(ctx, rec.Value, hs...)
		if errors.Is(err, debezium.ErrSkip) {
			return
		}
		if err != nil {
			// It may be the END of a transaction whose events are not
			// all applied: it holds the horizon at its record's time, as
			// a transaction that never completes, until it is given up.
			r.log.Warn("a transaction metadata record cannot be read; it holds complete_through until it is given up",
				zap.String("topic", rec.Topic), zap.Int32("partition", rec.Partition), zap.Int64("offset", rec.Offset), zap.Error(err))
			r.pending[rec.Topic] = append(r.pending[rec.Topic], txns.End{Partition: rec.Partition, Offset: rec.Offset,
				ID: fmt.Sprintf("undecodable %d/%d", rec.Partition, rec.Offset), Commit: r.lastCommit[change.Partition{Topic: rec.Topic, Partition: rec.Partition}], Hold: true,
				Counts: map[string]int64{"": 1}, Awaited: map[string]bool{"": true}})
			return
		}
		if tr.Status != "END" {
			return
		}
		if tr.Commit.After(r.lastCommit[change.Partition{Topic: rec.Topic, Partition: rec.Partition}]) {
			r.lastCommit[change.Partition{Topic: rec.Topic, Partition: rec.Partition}] = tr.Commit
		}
		id := tr.ID
		if r.cfg.ID != nil {
			id = r.cfg.ID(rec.Topic, id)
		}
		e := txns.End{Partition: rec.Partition, Offset: rec.Offset, ID: id, Commit: tr.Commit, Counts: tr.Counts,
			Awaited: map[string]bool{}}
		for c := range tr.Counts {
			e.Awaited[c] = r.cfg.Awaited != nil && r.cfg.Awaited(rec.Topic, c)
		}
		r.pending[rec.Topic] = append(r.pending[rec.Topic], e)
	})
}

// flush records what was read and maintains each topic; a topic with
// too many transactions in flight is paused until they are applied.
func (r *Reader) flush(ctx context.Context, cl *kgo.Client) {
	for _, topic := range r.cfg.Topics {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if next := r.next[topic]; len(next) > 0 {
			switch err := r.store.Record(fctx, topic, r.pending[topic], next); {
			case err == nil:
				r.pending[topic], r.next[topic] = nil, nil
			case errors.Is(err, txns.ErrBusy):
			case ctx.Err() == nil:
				r.warn("record "+topic, "recording a transaction topic's ENDs failed; retrying", zap.String("topic", topic), zap.Error(err))
			}
		}
		sweep := time.Since(r.swept[topic]) > time.Minute
		given, err := r.store.Maintain(fctx, topic, sweep)
		if err == nil && sweep {
			r.swept[topic] = time.Now()
		}
		if n, ferr := r.store.InFlight(fctx, topic); ferr == nil {
			if n > maxInFlight {
				cl.PauseFetchTopics(topic)
			} else {
				cl.ResumeFetchTopics(topic)
			}
		}
		cancel()
		if err != nil && !errors.Is(err, txns.ErrBusy) && ctx.Err() == nil {
			r.warn("maintain "+topic, "pruning a transaction topic's transactions failed; retrying", zap.String("topic", topic), zap.Error(err))
		}
		if len(given) > 0 {
			first := given[0]
			r.log.Warn("source transactions still missed events long after their tables were applied past them: given up, they no longer hold complete_through",
				zap.String("topic", topic), zap.Int("collections", len(given)), zap.String("first_transaction", first.ID),
				zap.String("first_collection", first.Collection), zap.Time("first_commit", first.Commit),
				zap.Int64("first_expected", first.Expected), zap.Int64("first_applied", first.Applied))
		}
		for _, g := range given {
			if r.cfg.OnGivenUp != nil {
				r.cfg.OnGivenUp(topic, g)
			}
		}
	}
}
