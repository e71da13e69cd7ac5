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
//     when the group has applied nothing yet (a new deployment reads the
//     data topics from their start too), else from its end: transactions
//     applied before had no marks, and waiting for them would hold the
//     watermark for nothing.
//   - What it read and could not record yet (PostgreSQL away, another
//     member holding the topic's lock) is kept and recorded again; while
//     too much waits it reads no further.
//   - It never stops the pipeline: failures are logged and retried. Until
//     its first END is recorded, the targets of its topic have no
//     complete_through.
package txlog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/sink/txns"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// Store records what is read; sink/txns.Reads is the one. Its methods
// may be called from one goroutine at a time per topic.
type Store interface {
	// Positions gives each recorded partition's next offset, and
	// whether the group has applied anything yet.
	Positions(ctx context.Context, topic string) (map[int32]int64, bool, error)
	// Record writes ENDs and next offsets in one transaction
	// (txns.ErrBusy: another member holds the topic now).
	Record(ctx context.Context, topic string, ends []txns.End, next map[int32]int64) error
	// Maintain gives up what waited too long and prunes what is done.
	Maintain(ctx context.Context, topic string) ([]txns.GivenUp, error)
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
		next: map[string]map[int32]int64{}, warned: map[string]time.Time{}}
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
		txn, ok := resolve(topic[:i] + "." + collection)
		return ok && txn == topic
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

// Run reads until ctx ends.
func (r *Reader) Run(ctx context.Context) error {
	if len(r.cfg.Topics) == 0 {
		return nil
	}
	cl, err := r.cfg.Client()
	if err != nil {
		return fmt.Errorf("the transaction topics' client: %w", err)
	}
	defer cl.Close()
	if !r.start(ctx, cl) {
		return nil
	}
	tick := time.NewTicker(r.cfg.Every)
	defer tick.Stop()
	for ctx.Err() == nil {
		if r.waiting() < maxPending {
			r.poll(ctx, cl)
		} else {
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case <-tick.C:
			r.flush(ctx)
		default:
		}
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

// start sets where each topic's partitions are read from, waiting (and
// retrying) for PostgreSQL and for the topics to exist. It reports false
// when ctx ended first.
func (r *Reader) start(ctx context.Context, cl *kgo.Client) bool {
	adm := kadm.NewClient(cl)
	todo := append([]string(nil), r.cfg.Topics...)
	backoff := time.Second
	for len(todo) > 0 {
		var left []string
		add := map[string]map[int32]kgo.Offset{}
		for _, topic := range todo {
			offsets, err := r.offsets(ctx, adm, topic)
			if err != nil {
				r.warn("start "+topic, "cannot start reading a transaction topic yet; its tables have no complete_through meanwhile",
					zap.String("topic", topic), zap.Error(err))
				left = append(left, topic)
				continue
			}
			add[topic] = offsets
		}
		if len(add) > 0 {
			cl.AddConsumePartitions(add)
		}
		if todo = left; len(todo) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
	return ctx.Err() == nil
}

// offsets returns where topic's partitions are read from.
func (r *Reader) offsets(ctx context.Context, adm *kadm.Client, topic string) (map[int32]kgo.Offset, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stored, applied, err := r.store.Positions(lctx, topic)
	if err != nil {
		return nil, err
	}
	details, err := adm.ListTopics(lctx, topic)
	if err != nil {
		return nil, err
	}
	d, ok := details[topic]
	if !ok || d.Err != nil || len(d.Partitions) == 0 {
		if ok && d.Err != nil {
			return nil, fmt.Errorf("topic %s: %w", topic, d.Err)
		}
		return nil, fmt.Errorf("topic %s does not exist (is provide.transaction.metadata=true set on the connector?)", topic)
	}
	out := map[int32]kgo.Offset{}
	for p := range d.Partitions {
		switch n, ok := stored[p]; {
		case ok:
			out[p] = kgo.NewOffset().At(n)
		case applied:
			out[p] = kgo.NewOffset().AtEnd()
		default:
			out[p] = kgo.NewOffset().AtStart()
		}
	}
	r.log.Info("reading a transaction topic", zap.String("topic", topic), zap.Int("partitions", len(out)),
		zap.Bool("from_recorded_positions", len(stored) > 0), zap.Bool("from_end", len(stored) == 0 && applied))
	return out, nil
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
			// Its transaction is then not waited for: the watermark stays
			// what it is without the topic.
			r.warn("decode "+rec.Topic, "a transaction metadata record cannot be read; its transaction is not waited for",
				zap.String("topic", rec.Topic), zap.Int32("partition", rec.Partition), zap.Int64("offset", rec.Offset), zap.Error(err))
			return
		}
		if tr.Status != "END" {
			return
		}
		e := txns.End{Partition: rec.Partition, Offset: rec.Offset, ID: tr.ID, Commit: tr.Commit, Counts: tr.Counts,
			Awaited: map[string]bool{}}
		for c := range tr.Counts {
			e.Awaited[c] = r.cfg.Awaited != nil && r.cfg.Awaited(rec.Topic, c)
		}
		r.pending[rec.Topic] = append(r.pending[rec.Topic], e)
	})
}

// flush records what was read and maintains each topic.
func (r *Reader) flush(ctx context.Context) {
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
		given, err := r.store.Maintain(fctx, topic)
		cancel()
		if err != nil && !errors.Is(err, txns.ErrBusy) && ctx.Err() == nil {
			r.warn("maintain "+topic, "pruning a transaction topic's transactions failed; retrying", zap.String("topic", topic), zap.Error(err))
		}
		for _, g := range given {
			r.log.Warn("a source transaction still misses events long after its tables were applied past it: given up, it no longer holds complete_through",
				zap.String("topic", topic), zap.String("transaction", g.ID), zap.String("collection", g.Collection),
				zap.Time("commit", g.Commit), zap.Int64("expected", g.Expected), zap.Int64("applied", g.Applied))
			if r.cfg.OnGivenUp != nil {
				r.cfg.OnGivenUp(topic, g)
			}
		}
	}
}
