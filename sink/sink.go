package sink

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"go.uber.org/zap"
)

// Sink applies batches of change events to SCD2 history tables. It is not
// safe for concurrent use: one goroutine calls Apply at a time, and batches
// must be applied in the order their offsets were released.
type Sink struct {
	cfg    Config
	pool   *pgxpool.Pool
	log    *zap.Logger
	conv   converter
	specs  map[string]TableSpec
	tables map[string]*table
}

// New validates cfg and returns a Sink writing through pool. Call Init before
// the first Apply.
func New(cfg Config, pool *pgxpool.Pool) (*Sink, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s := &Sink{cfg: cfg, pool: pool, log: cfg.Logger, conv: converter{m: pgtype.NewMap()},
		specs: map[string]TableSpec{}, tables: map[string]*table{}}
	for _, t := range cfg.Tables {
		s.specs[t.Target] = t
	}
	return s, nil
}

// Init creates the service's own tables and every configured history table
// that declares its columns, retrying transient errors.
func (s *Sink) Init(ctx context.Context) error {
	_, err := s.withRetry(ctx, "creating tables", func(ctx context.Context) error {
		if err := ensureServiceTables(ctx, s.pool, &s.cfg); err != nil {
			return err
		}
		for _, spec := range s.cfg.Tables {
			if len(spec.Columns) == 0 {
				continue
			}
			t, err := ensureTable(ctx, s.pool, spec, nil)
			if err != nil {
				return err
			}
			s.tables[spec.Target] = t
		}
		return nil
	})
	return err
}

// prepare creates tables met for the first time and adds columns that
// events carry but their tables lack. DDL runs in its own transactions.
func (s *Sink) prepare(ctx context.Context, evs []*change.Event) error {
	extra := map[string]map[string]string{}
	for _, ev := range evs {
		spec, ok := s.specs[ev.Table]
		if !ok {
			continue
		}
		t := s.tables[ev.Table]
		note := func(name string, v any) {
			if t != nil {
				if _, ok := t.colIdx[name]; ok {
					return
				}
			}
			m := extra[ev.Table]
			if m == nil {
				m = map[string]string{}
				extra[ev.Table] = m
			}
			if cur, ok := m[name]; !ok || (cur == "text" && v != nil) {
				m[name] = inferType(v)
			}
		}
		if len(ev.Key) == len(spec.Keys) {
			for i, k := range spec.Keys {
				note(k, ev.Key[i])
			}
		}
		for name, v := range ev.After {
			if !contains(spec.IgnoreColumns, name) {
				note(name, v)
			}
		}
	}
	for target, cols := range extra {
		_, err := s.withRetry(ctx, "creating table "+target, func(ctx context.Context) error {
			t, err := ensureTable(ctx, s.pool, s.specs[target], cols)
			if err != nil {
				return err
			}
			s.tables[target] = t
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Apply folds a batch into the history tables, writes its dead letters and
// records its offsets, all in one transaction, retried as a whole on
// transient errors. A returned error means nothing of the batch was applied.
func (s *Sink) Apply(ctx context.Context, b Batch) (Result, error) {
	if err := s.prepare(ctx, b.Events); err != nil {
		return Result{}, err
	}
	t0 := time.Now()
	plans, dead := s.plan(b.Events)
	trace("plan", t0)
	dead = append(append([]DeadLetter(nil), b.DeadLetters...), dead...)
	targets := make([]string, 0, len(plans))
	for name := range plans {
		targets = append(targets, name)
	}
	sort.Strings(targets) // a fixed lock order across instances
	var res Result
	retries, err := s.withRetry(ctx, "applying batch", func(ctx context.Context) error {
		res = Result{}
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			allDead := dead
			for _, name := range targets {
				r, d, err := s.applyTable(ctx, tx, plans[name])
				if err != nil {
					return fmt.Errorf("applying batch to %s: %w", name, err)
				}
				res.add(r)
				allDead = append(allDead, d...)
			}
			if err := s.writeDeadLetters(ctx, tx, allDead); err != nil {
				return err
			}
			res.DeadLetters = len(allDead)
			return s.writeOffsets(ctx, tx, b.Offsets)
		})

	})
	res.Retries = retries
	return res, err
}

func (s *Sink) writeDeadLetters(ctx context.Context, tx pgx.Tx, dead []DeadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	rows := make([][]any, len(dead))
	now := time.Now()
	for i, d := range dead {
		rows[i] = []any{d.Origin.Topic, d.Origin.Partition.Partition, d.Origin.Offset, d.Table, d.Key, d.Value, d.Err, now}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{s.cfg.Schema, s.cfg.DeadLetterTable},
		[]string{"topic", "partition", "offset", "target", "key", "value", "error", "created_at"}, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("writing %d dead letters: %w", len(dead), err)
	}
	return nil
}

func (s *Sink) writeOffsets(ctx context.Context, tx pgx.Tx, offsets map[change.Partition]int64) error {
	if len(offsets) == 0 {
		return nil
	}
	var topics []string
	var parts []int32
	var offs []int64
	for p, o := range offsets {
		topics, parts, offs = append(topics, p.Topic), append(parts, p.Partition), append(offs, o)
	}
	q := fmt.Sprintf(`INSERT INTO %s.scd2sink_offsets (consumer_group, topic, partition, next_offset, updated_at)
		SELECT $1, t, p, o, now() FROM unnest($2::text[], $3::int[], $4::bigint[]) AS x(t, p, o)
		ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = excluded.next_offset, updated_at = now()`,
		pgx.Identifier{s.cfg.Schema}.Sanitize())
	if _, err := tx.Exec(ctx, q, s.cfg.ConsumerGroup, topics, parts, offs); err != nil {
		return fmt.Errorf("recording offsets: %w", err)
	}
	return nil
}

// Offsets returns the offsets recorded in scd2sink_offsets for the
// configured consumer group: the next offset to consume per partition.
func (s *Sink) Offsets(ctx context.Context) (map[change.Partition]int64, error) {
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT topic, partition, next_offset FROM %s.scd2sink_offsets WHERE consumer_group = $1`,
		pgx.Identifier{s.cfg.Schema}.Sanitize()), s.cfg.ConsumerGroup)
	if err != nil {
		return nil, fmt.Errorf("reading scd2sink_offsets: %w", err)
	}
	defer rows.Close()
	out := map[change.Partition]int64{}
	for rows.Next() {
		var p change.Partition
		var o int64
		if err := rows.Scan(&p.Topic, &p.Partition, &o); err != nil {
			return nil, err
		}
		out[p] = o
	}
	return out, rows.Err()
}
