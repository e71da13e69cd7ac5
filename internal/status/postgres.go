package status

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/catalog"
)

// pgState is what the report reads from PostgreSQL.
type pgState struct {
	ok            bool // read (else every figure from PostgreSQL is unknown)
	appliedTopics []string
	offsets       map[string]map[int32]int64 // topic -> partition -> next offset
	marks         map[string]time.Time       // target -> complete_through
	dead          map[string]map[string]int64
	held          map[string]heldState
	versions      map[string]int64
	estimated     map[string]bool
	soft          []string // what could not be read of one table
}

type heldState struct {
	n             int
	closing, live int64
}

// readPostgres reads the service's tables and counts the history tables'
// versions; offsetsOnly reads the offsets applied only (a chart's sample).
// Tables that do not exist (a database the service never
// wrote) are read as empty: nothing is created.
func (c *Collector) readPostgres(ctx context.Context, offsetsOnly bool) (pgState, error) {
	st := pgState{offsets: map[string]map[int32]int64{}, marks: map[string]time.Time{}, dead: map[string]map[string]int64{},
		held: map[string]heldState{}, versions: map[string]int64{}, estimated: map[string]bool{}}
	if c.pool == nil {
		return st, errors.New("no connection")
	}
	schema := c.cfg.Postgres.Schema
	dl := c.cfg.Sink.DeadLetterTable
	exists, err := c.existing(ctx, schema, catalog.OffsetsTable, catalog.WatermarkView, catalog.SnapshotsTable, dl)
	if err != nil {
		return st, err
	}
	s := quoteIdent(schema)
	group := c.cfg.Kafka.GroupID
	if exists[catalog.OffsetsTable] {
		err := c.each(ctx, func(r pgx.Rows) error {
			var topic string
			var p int32
			var next int64
			if err := r.Scan(&topic, &p, &next); err != nil {
				return err
			}
			if st.offsets[topic] == nil {
				st.offsets[topic] = map[int32]int64{}
				st.appliedTopics = append(st.appliedTopics, topic)
			}
			st.offsets[topic][p] = next
			return nil
		}, `SELECT topic, partition, next_offset FROM `+s+`.scd2sink_offsets WHERE consumer_group = $1 ORDER BY topic, partition`, group)
		if err != nil {
			return st, fmt.Errorf("reading the offsets applied: %w", err)
		}
	}
	if offsetsOnly {
		st.ok = true
		return st, nil
	}
	if exists[catalog.WatermarkView] {
		err := c.each(ctx, func(r pgx.Rows) error {
			var target string
			var at time.Time
			if err := r.Scan(&target, &at); err != nil {
				return err
			}
			st.marks[target] = at
			return nil
		}, `SELECT target, complete_through FROM `+s+`.`+catalog.WatermarkView+` WHERE complete_through IS NOT NULL`)
		if err != nil {
			return st, fmt.Errorf("reading the completeness watermarks: %w", err)
		}
	}
	if exists[dl] {
		reason := "coalesce(reason, 'unknown')"
		if !exists[dl+".reason"] {
			reason = "'unknown'" // a table of an older release, not migrated yet
		}
		err := c.each(ctx, func(r pgx.Rows) error {
			var target, why string
			var n int64
			if err := r.Scan(&target, &why, &n); err != nil {
				return err
			}
			if st.dead[target] == nil {
				st.dead[target] = map[string]int64{}
			}
			st.dead[target][why] = n
			return nil
		}, `SELECT coalesce(target, ''), `+reason+`, count(*) FROM `+s+`.`+quoteIdent(dl)+` WHERE replayed_at IS NULL GROUP BY 1, 2`)
		if err != nil {
			return st, fmt.Errorf("counting the dead letters: %w", err)
		}
	}
	if exists[catalog.SnapshotsTable] {
		err := c.each(ctx, func(r pgx.Rows) error {
			var target string
			var h heldState
			if err := r.Scan(&target, &h.n, &h.closing, &h.live); err != nil {
				return err
			}
			st.held[target] = h
			return nil
		}, `SELECT target, count(*)::int, coalesce(sum(held_keys), 0)::bigint, coalesce(max(live_keys), 0) FROM `+s+`.scd2sink_snapshots
			WHERE consumer_group = $1 AND held_at IS NOT NULL AND done_at IS NULL GROUP BY target`, group)
		if err != nil {
			return st, fmt.Errorf("reading the held reconciliations: %w", err)
		}
	}
	if err := c.countVersions(ctx, &st); err != nil {
		return st, err
	}
	st.ok = true
	return st, nil
}

// existing reports which of the schema's tables exist, and whether the
// dead-letter table has its reason column (key "<table>.reason").
func (c *Collector) existing(ctx context.Context, schema string, tables ...string) (map[string]bool, error) {
	out := map[string]bool{}
	dl := tables[len(tables)-1]
	err := c.each(ctx, func(r pgx.Rows) error {
		var name string
		var ok, reason bool
		if err := r.Scan(&name, &ok, &reason); err != nil {
			return err
		}
		out[name] = ok
		if name == dl {
			out[dl+".reason"] = reason
		}
		return nil
	}, `SELECT t, to_regclass(format('%I.%I', $1::text, t)) IS NOT NULL,
		EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(format('%I.%I', $1::text, t)) AND attname = 'reason' AND NOT attisdropped)
		FROM unnest($2::text[]) t`, schema, tables)
	if err != nil {
		return nil, fmt.Errorf("looking up the service's tables: %w", err)
	}
	return out, nil
}

// exactBytes is the size on disk above which a table's versions are
// estimated, whatever its statistics say.
const exactBytes = 64 << 20

// countVersions counts each history table's rows: exactly below
// ExactBelow rows (by PostgreSQL's statistics) and exactBytes on disk,
// else the statistics' estimate.
func (c *Collector) countVersions(ctx context.Context, st *pgState) error {
	names := make([]string, 0, len(c.cfg.Tables))
	for _, t := range c.targets(st.appliedTopics) {
		names = append(names, t.Target)
	}
	type size struct{ est, live, bytes float64 }
	sizes := map[string]size{}
	err := c.each(ctx, func(r pgx.Rows) error {
		var name string
		var z size
		if err := r.Scan(&name, &z.est, &z.live, &z.bytes); err != nil {
			return err
		}
		sizes[name] = z
		return nil
	}, `SELECT t, coalesce(sum(greatest(c.reltuples, 0)), 0), coalesce(sum(s.n_live_tup), 0), coalesce(sum(pg_relation_size(c.oid)), 0)
		FROM unnest($2::text[]) t
		JOIN pg_class c ON c.oid = to_regclass(format('%I.%I', $1::text, t))
			OR c.oid IN (SELECT relid FROM pg_partition_tree(to_regclass(format('%I.%I', $1::text, t)))) -- a partitioned table's partitions
		LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
		WHERE to_regclass(format('%I.%I', $1::text, t)) IS NOT NULL
		GROUP BY t`, c.cfg.Postgres.Schema, names)
	if err != nil {
		return fmt.Errorf("reading the history tables' sizes: %w", err)
	}
	for name, z := range sizes {
		// Statistics lag (a table never analysed after an import reads
		// as empty): its size on disk decides too.
		if z.est >= float64(c.opts.ExactBelow) || z.live >= float64(c.opts.ExactBelow) || z.bytes >= exactBytes {
			st.versions[name], st.estimated[name] = int64(max(z.est, z.live)), true
			continue
		}
		var count int64
		if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM `+quoteIdent(c.cfg.Postgres.Schema, name)).Scan(&count); err != nil {
			// One table locked by another session (past lock_timeout)
			// leaves its count unknown, not the whole report.
			st.soft = append(st.soft, fmt.Sprintf("counting the versions of %s: %v", name, err))
			continue
		}
		st.versions[name] = count
	}
	return nil
}

// each runs query and calls fn for each row.
func (c *Collector) each(ctx context.Context, fn func(pgx.Rows) error, query string, args ...any) error {
	rows, err := c.pool.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
