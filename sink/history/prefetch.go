package history

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/plan"
	"github.com/scd2sink/scd2sink/sink/statecache"
)

// Reading ahead for a batch of many tables.
//
// Each table's share of a batch starts with two reads: the target's
// truncates and the latest version of each of its keys the state cache
// does not hold. Table after table, that is two round trips per table
// before its first write: at 200 tables of a few keys each, 400 round
// trips that cost more than the statements. The prefetch sends those
// reads for every table of the batch in one pipeline (one round trip) at
// the start of the transaction, after the batch's early truncates are
// recorded, and each table's share takes what was read for it the first
// time it is applied. With one table it saves one round trip of two.
//
// A statement that fails is its table's (a TargetError: that table
// parks, the others go on): the one whose results were being read, or,
// when PostgreSQL fails it while the pipeline is prepared (a column
// renamed by hand, a table held ACCESS EXCLUSIVE), the one pgx names
// (ErrPreprocessingBatch). Only the shared reads (column types,
// truncates) fail the batch as a whole, as the fence would.
//
// What a share takes is what its own first read would have returned: in
// the transaction nothing writes a table's history or its target's
// truncates before its share is applied (shares write only their own
// table; the early truncates come before the prefetch). A share applied
// again in the same transaction (the second pass of primary-key changes,
// keychange.go) reads afresh: the prefetch is taken once per table. Keys
// read ahead that the share does not read after all (the cache gained
// them meanwhile, a new truncate folds them again) cost a lookup and
// change nothing. Left out, and read by the share as before: tables with
// a truncate in the batch (it folds keys again before they are read) and
// batches applied isolating values (each event in a savepoint of its own).

// Prefetched is what the prefetch read, per table; a share takes its
// table's entries (take*), which removes them.
type Prefetched struct {
	truncs map[*plan.Table][]fold.Event
	latest map[*plan.Table]map[*plan.KeyPlan]*fold.Latest
	// types are the column types of each table locked ahead (by its
	// quoted name; a domain's column 0), for its COPY: they hold to the
	// end of the transaction.
	types map[string]map[string]uint32
}

// TakeTruncates returns t's truncates as read ahead, once.
func (p *Prefetched) TakeTruncates(t *plan.Table) ([]fold.Event, bool) {
	if p == nil {
		return nil, false
	}
	tr, ok := p.truncs[t]
	delete(p.truncs, t)
	return tr, ok
}

// columnTypes returns the types of the columns of table, as a describe
// of it in this transaction would (nil: not read ahead).
func (p *Prefetched) columnTypes(table pgx.Identifier) map[string]uint32 {
	if p == nil {
		return nil
	}
	return p.types[table.Sanitize()]
}

// TakeLatest returns the latest states read ahead for t's keys, once.
func (p *Prefetched) TakeLatest(t *plan.Table) map[*plan.KeyPlan]*fold.Latest {
	if p == nil {
		return nil
	}
	l := p.latest[t]
	delete(p.latest, t)
	return l
}

// Prefetch reads ahead for the targets' shares of the batch (see above).
func Prefetch(ctx context.Context, tx pgx.Tx, schema string, holds func(statecache.Key) bool, plans map[string]*plan.TablePlan, targets []string) (*Prefetched, error) {
	pre := &Prefetched{truncs: map[*plan.Table][]fold.Event{}, latest: map[*plan.Table]map[*plan.KeyPlan]*fold.Latest{}, types: map[string]map[string]uint32{}}
	byName := map[string]*plan.Table{}
	var names, rels []string
	var reads []func(b *pgx.Batch)
	failing := ""                // the target whose statement is being read
	bySQL := map[string]string{} // each statement's target
	queue := func(b *pgx.Batch, target, q string, args []any, fn func(pgx.Rows) error) {
		bySQL[q] = target
		b.Queue(q, args...).Fn = func(br pgx.BatchResults) error {
			failing = target
			rows, _ := br.Query()
			defer rows.Close()
			if err := fn(rows); err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		}
	}
	b := &pgx.Batch{}
	for _, name := range targets {
		p := plans[name]
		if p == nil || p.Table == nil {
			continue
		}
		t := p.Table
		if _, dup := pre.truncs[t]; dup {
			continue
		}
		pre.truncs[t] = nil // none recorded, unless read below
		names = append(names, t.Hist.Sanitize())
		byName[t.Hist.Sanitize()] = t
		// The lock a describe before each COPY would take (CopyIn), so
		// that the types read below hold; ONLY: a partitioned table's
		// column types change through its parent, and its partitions are
		// locked as they are written (a lock per partition of years of
		// history would fill the lock table).
		rels = append(rels, t.Hist.Sanitize(), t.Side.Sanitize())
		queue(b, name, fmt.Sprintf("LOCK TABLE ONLY %s, %s IN ACCESS SHARE MODE", t.Hist.Sanitize(), t.Side.Sanitize()), nil,
			func(pgx.Rows) error { return nil })
		if len(p.Truncates) > 0 {
			continue
		}
		var keys []*plan.KeyPlan
		for _, kp := range p.Order {
			if len(kp.Events) > 0 && !holds(t.CacheKey(kp.ID)) {
				keys = append(keys, kp)
			}
		}
		if len(keys) == 0 {
			continue
		}
		reads = append(reads, func(b *pgx.Batch) {
			idx := make([]int, len(keys))
			for i := range idx {
				idx[i] = i
			}
			q, args := latestQuery(t, keys, idx, t.Parts != nil)
			queue(b, name, q, args, func(rows pgx.Rows) error {
				out := make([]fold.Latest, len(keys))
				if err := scanLatest(t, rows, idx, out); err != nil {
					return err
				}
				m := make(map[*plan.KeyPlan]*fold.Latest, len(keys))
				for i, kp := range keys {
					m[kp] = &out[i]
				}
				pre.latest[t] = m
				return nil
			})
		})
	}
	if len(names) == 0 {
		return nil, nil
	}
	queue(b, "", `SELECT x.r, a.attname, CASE WHEN ty.typtype = 'd' THEN 0 ELSE a.atttypid END
		FROM unnest($1::text[]) AS x(r) JOIN pg_catalog.pg_attribute a ON a.attrelid = to_regclass(x.r) AND a.attnum > 0 AND NOT a.attisdropped
		JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid`, []any{rels}, func(rows pgx.Rows) error {
		for rows.Next() {
			var rel, col string
			var oid uint32
			if err := rows.Scan(&rel, &col, &oid); err != nil {
				return err
			}
			if pre.types[rel] == nil {
				pre.types[rel] = map[string]uint32{}
			}
			pre.types[rel][col] = oid
		}
		return rows.Err()
	})
	for _, read := range reads {
		read(b)
	}
	queue(b, "", fmt.Sprintf(`SELECT target, scd_seq, valid_from FROM %s.scd2sink_truncates WHERE target = ANY($1::text[]) ORDER BY target, scd_seq`,
		pgx.Identifier{schema}.Sanitize()), []any{names}, func(rows pgx.Rows) error {
		for rows.Next() {
			var target string
			var seq []byte
			var at time.Time
			if err := rows.Scan(&target, &seq, &at); err != nil {
				return err
			}
			if t := byName[target]; t != nil {
				pre.truncs[t] = append(pre.truncs[t], fold.Event{Seq: seq, Op: change.OpTruncate, T: at})
			}
		}
		return rows.Err()
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		var pe pgx.ErrPreprocessingBatch
		if failing == "" && errors.As(err, &pe) {
			failing = bySQL[pe.SQL()]
		}
		if failing != "" {
			return nil, &plan.TargetError{Target: failing, Err: fmt.Errorf("applying batch to %s: %w", failing, err)}
		}
		return nil, fmt.Errorf("reading ahead for %d tables: %w", len(names), err)
	}
	return pre, nil
}
