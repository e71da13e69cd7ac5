package txns

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/sink/catalog"
)

// GiveUpAfter is how far (in valid time) every partition of a transaction
// topic's tables must have been applied past a transaction still missing
// events, and how long ago its END must have been read, before it is
// given up.
const GiveUpAfter = 10 * time.Minute

// ErrBusy says another member holds the transaction topic's lock: what
// was read is recorded by it, or again at the next try.
var ErrBusy = errors.New("another member is recording this transaction topic")

// End is one END record of a transaction topic.
type End struct {
	Partition int32
	Offset    int64
	ID        string
	Commit    time.Time
	// Counts are the events per data collection; Awaited says which
	// collections this configuration applies.
	Counts  map[string]int64
	Awaited map[string]bool
	// Hold marks the stand-in for a record that could not be decoded:
	// it moves no END time on.
	Hold bool
}

// GivenUp is a transaction collection given up (Maintain).
type GivenUp struct {
	ID, Collection    string
	Commit            time.Time
	Expected, Applied int64
}

// Reads records what is read from the transaction topics of one consumer
// group. Safe for concurrent use (its state is in PostgreSQL).
type Reads struct {
	pool          *pgxpool.Pool
	schema, group string
	// ReadWait is how long after its END was read a transaction still
	// missing events waits at least (default GiveUpAfter): a connector
	// catching up runs through ten minutes of valid time in seconds.
	ReadWait time.Duration
}

// NewReads returns the store of group's reads in schema.
func NewReads(pool *pgxpool.Pool, schema, group string) *Reads {
	return &Reads{pool: pool, schema: schema, group: group, ReadWait: GiveUpAfter}
}

func (r *Reads) s() string { return pgx.Identifier{r.schema}.Sanitize() }

// Where a transaction topic met for the first time is read from: the row
// of partition -1 (Begin) holds FromStart or FromEnd.
const (
	FromStart int64 = -2
	FromEnd   int64 = -1
)

// Begin records, the first time the group reads topic, where its
// partitions are read from: from the start when the group has applied
// nothing yet (a new deployment reads the data topics from their start
// too), else from the end (what was applied before left no marks). Call
// it before the group applies anything, so that the answer is not raced.
// latest: a group without offsets starts at the data topics' ends
// (kafka.start_offset: latest), so the transaction topic does too.
func (r *Reads) Begin(ctx context.Context, topic string, latest bool) error {
	_, err := r.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s.%[2]s (consumer_group, topic, partition, next_offset)
		SELECT $1, $2, -1, CASE WHEN $3 OR EXISTS (SELECT 1 FROM %[1]s.%[3]s WHERE consumer_group = $1) THEN %[4]d ELSE %[5]d END
		WHERE NOT EXISTS (SELECT 1 FROM %[1]s.%[2]s WHERE consumer_group = $1 AND topic = $2)
		ON CONFLICT DO NOTHING`, r.s(), catalog.TransactionReadsTable, catalog.OffsetsTable, FromEnd, FromStart), r.group, topic, latest)
	if err != nil {
		return fmt.Errorf("recording where transaction topic %s is read from: %w", topic, err)
	}
	return nil
}

// Positions returns the next offset to read of each recorded partition of
// topic (partition -1: FromStart or FromEnd, see Begin), and whether the
// group has applied anything of any topic.
func (r *Reads) Positions(ctx context.Context, topic string) (map[int32]int64, bool, error) {
	rows, err := r.pool.Query(ctx, fmt.Sprintf(`SELECT partition, next_offset FROM %s.%s WHERE consumer_group = $1 AND topic = $2`,
		r.s(), catalog.TransactionReadsTable), r.group, topic)
	if err != nil {
		return nil, false, fmt.Errorf("reading the positions of %s: %w", topic, err)
	}
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			return nil, false, err
		}
		out[p] = n
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("reading the positions of %s: %w", topic, err)
	}
	var applied bool
	if err := r.pool.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s.%s WHERE consumer_group = $1)`, r.s(), catalog.OffsetsTable),
		r.group).Scan(&applied); err != nil {
		return nil, false, fmt.Errorf("reading the offsets of group %s: %w", r.group, err)
	}
	return out, applied, nil
}

// lock takes topic's advisory lock for the transaction, or reports
// ErrBusy.
func (r *Reads) lock(ctx context.Context, tx pgx.Tx, topic string) error {
	var got bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 7102))`,
		"scd2sink transactions "+r.group+" "+topic).Scan(&got); err != nil {
		return fmt.Errorf("locking transaction topic %s: %w", topic, err)
	}
	if !got {
		return ErrBusy
	}
	return nil
}

// Record writes the ENDs read from topic and each partition's next offset
// (next; a partition read without an END in it moves on too), in one
// transaction; ENDs below a partition's stored position were recorded
// before and are skipped.
func (r *Reads) Record(ctx context.Context, topic string, ends []End, next map[int32]int64) error {
	return pgx.BeginTxFunc(ctx, r.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if err := r.lock(ctx, tx, topic); err != nil {
			return err
		}
		stored := map[int32]int64{}
		rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT partition, next_offset FROM %s.%s WHERE consumer_group = $1 AND topic = $2`,
			r.s(), catalog.TransactionReadsTable), r.group, topic)
		if err != nil {
			return err
		}
		for rows.Next() {
			var p int32
			var n int64
			if err := rows.Scan(&p, &n); err != nil {
				rows.Close()
				return err
			}
			stored[p] = n
		}
		if err := rows.Err(); err != nil {
			return err
		}
		var ids, colls []string
		var expected, offsets []int64
		var awaited []bool
		var commits []time.Time
		through := map[int32]time.Time{}
		for _, e := range ends {
			if n, ok := stored[e.Partition]; ok && e.Offset < n {
				continue
			}
			if !e.Hold && e.Commit.After(through[e.Partition]) {
				through[e.Partition] = e.Commit
			}
			names := make([]string, 0, len(e.Counts))
			for c := range e.Counts {
				names = append(names, c)
			}
			sort.Strings(names)
			for _, c := range names {
				ids, colls, expected = append(ids, e.ID), append(colls, c), append(expected, e.Counts[c])
				awaited, commits, offsets = append(awaited, e.Awaited[c]), append(commits, e.Commit), append(offsets, e.Offset)
			}
		}
		if len(ids) > 0 {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.%s (consumer_group, topic, id, collection, expected, awaited, commit_at, "offset")
				SELECT $1, $2, x.id, x.c, x.n, x.w, x.t, x.o FROM unnest($3::text[], $4::text[], $5::bigint[], $6::boolean[], $7::timestamptz[], $8::bigint[])
				AS x(id, c, n, w, t, o) ON CONFLICT DO NOTHING`, r.s(), catalog.TransactionsTable),
				r.group, topic, ids, colls, expected, awaited, commits, offsets); err != nil {
				return fmt.Errorf("recording the transactions read from %s: %w", topic, err)
			}
		}
		var parts []int32
		var nexts []int64
		var thr []*time.Time
		for p, n := range next {
			parts, nexts = append(parts, p), append(nexts, n)
			if t, ok := through[p]; ok {
				thr = append(thr, &t)
			} else {
				thr = append(thr, nil)
			}
		}
		if len(parts) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s.%[2]s AS r (consumer_group, topic, partition, next_offset, read_through)
			SELECT $1, $2, x.p, x.n, x.t FROM unnest($3::int[], $4::bigint[], $5::timestamptz[]) AS x(p, n, t)
			ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = greatest(r.next_offset, excluded.next_offset),
				read_through = greatest(r.read_through, excluded.read_through), updated_at = now()`, r.s(), catalog.TransactionReadsTable),
			r.group, topic, parts, nexts, thr); err != nil {
			return fmt.Errorf("recording the position in %s: %w", topic, err)
		}
		return nil
	})
}

// applied counts the marks of a transactions row t.
const applied = `(SELECT count(*) FROM %[1]s.%[2]s m WHERE m.consumer_group = t.consumer_group AND m.topic = t.topic
	AND m.id = t.id AND m.collection = t.collection)`

// oldest bounds the rows one Maintain considers giving up: the topic's
// oldest by commit time (those before the earliest incomplete one are
// pruned, so these are the ones that wait).
const oldest = 100

// Maintain gives up the transactions of topic that waited too long (see
// GiveUpAfter) and prunes those complete or given up, with their marks;
// marks a day old that no END names are dropped too (events delivered
// again after their transaction was pruned), when sweep is set. It
// returns what it gave up; ErrBusy while another member holds the topic.
func (r *Reads) Maintain(ctx context.Context, topic string, sweep bool) ([]GivenUp, error) {
	var out []GivenUp
	err := pgx.BeginTxFunc(ctx, r.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		out = out[:0]
		if err := r.lock(ctx, tx, topic); err != nil {
			return err
		}
		cnt := fmt.Sprintf(applied, r.s(), catalog.TransactionEventsTable)
		head := fmt.Sprintf(`(SELECT * FROM %s.%s WHERE consumer_group = $1 AND topic = $2 ORDER BY commit_at LIMIT %d)`,
			r.s(), catalog.TransactionsTable, oldest)
		rows, err := tx.Query(ctx, fmt.Sprintf(`UPDATE %[1]s.%[2]s u SET given_up_at = now()
			FROM (SELECT t.id, t.collection, %[3]s AS n FROM %[6]s t
				WHERE t.given_up_at IS NULL AND t.read_at < now() - make_interval(secs => $4)
					AND t.commit_at + make_interval(secs => $3) < (SELECT CASE WHEN bool_or(w IS NULL) THEN NULL ELSE min(w) END
						FROM (SELECT greatest(o.last_valid_from, p.caught_up_at) AS w FROM %[1]s.%[4]s p
							LEFT JOIN %[1]s.%[5]s o ON o.consumer_group = p.consumer_group AND o.topic = p.topic AND o.partition = p.partition
							WHERE p.consumer_group = $1 AND p.transaction_topic = $2) q)) g
			WHERE u.consumer_group = $1 AND u.topic = $2 AND u.id = g.id AND u.collection = g.collection
				AND (u.awaited OR g.n > 0) AND g.n < u.expected
			RETURNING u.id, u.collection, u.commit_at, u.expected, g.n`,
			r.s(), catalog.TransactionsTable, cnt, catalog.ProgressTable, catalog.OffsetsTable, head), r.group, topic, GiveUpAfter.Seconds(), r.ReadWait.Seconds())
		if err != nil {
			return fmt.Errorf("giving up transactions of %s: %w", topic, err)
		}
		for rows.Next() {
			var g GivenUp
			if err := rows.Scan(&g.ID, &g.Collection, &g.Commit, &g.Expected, &g.Applied); err != nil {
				rows.Close()
				return err
			}
			out = append(out, g)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("giving up transactions of %s: %w", topic, err)
		}
		// Every row before the earliest incomplete transaction is complete
		// (or given up): those go, with their marks, without counting
		// each (NULL: nothing incomplete, all go).
		var first *time.Time
		if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT t.commit_at FROM %[1]s.%[2]s t
			CROSS JOIN LATERAL (SELECT %[3]s AS n) e
			WHERE t.consumer_group = $1 AND t.topic = $2 AND t.given_up_at IS NULL AND (t.awaited OR e.n > 0) AND e.n < t.expected
			ORDER BY t.commit_at LIMIT 1`, r.s(), catalog.TransactionsTable, cnt), r.group, topic).Scan(&first); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("finding the earliest incomplete transaction of %s: %w", topic, err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`WITH done AS (
				DELETE FROM %[1]s.%[2]s t WHERE t.consumer_group = $1 AND t.topic = $2
					AND ($3::timestamptz IS NULL OR t.commit_at < $3 OR t.given_up_at IS NOT NULL)
				RETURNING t.consumer_group, t.topic, t.id, t.collection)
			DELETE FROM %[1]s.%[3]s m USING done d WHERE m.consumer_group = d.consumer_group AND m.topic = d.topic
				AND m.id = d.id AND m.collection = d.collection`,
			r.s(), catalog.TransactionsTable, catalog.TransactionEventsTable), r.group, topic, first); err != nil {
			return fmt.Errorf("pruning the complete transactions of %s: %w", topic, err)
		}
		if !sweep {
			return nil
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %[1]s.%[2]s m WHERE m.consumer_group = $1 AND m.topic = $2
			AND m.noted_at < now() - interval '1 day'
			AND NOT EXISTS (SELECT 1 FROM %[1]s.%[3]s t WHERE t.consumer_group = m.consumer_group AND t.topic = m.topic
				AND t.id = m.id AND t.collection = m.collection)`,
			r.s(), catalog.TransactionEventsTable, catalog.TransactionsTable), r.group, topic); err != nil {
			return fmt.Errorf("pruning the marks of %s: %w", topic, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// InFlight counts the transaction rows of topic recorded and not yet
// pruned: what is read ahead of the applied events.
func (r *Reads) InFlight(ctx context.Context, topic string) (int64, error) {
	var n int64
	if err := r.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.%s WHERE consumer_group = $1 AND topic = $2`,
		r.s(), catalog.TransactionsTable), r.group, topic).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the transactions of %s: %w", topic, err)
	}
	return n, nil
}

// Started records the partitions of topic the reader starts reading, at
// next (a partition met for the first time gets a row without an END
// time: the topic has no horizon until every partition has one).
func (r *Reads) Started(ctx context.Context, topic string, next map[int32]int64) error {
	var parts []int32
	var offs []int64
	for p, n := range next {
		parts, offs = append(parts, p), append(offs, n)
	}
	if _, err := r.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.%s (consumer_group, topic, partition, next_offset)
		SELECT $1, $2, x.p, x.n FROM unnest($3::int[], $4::bigint[]) AS x(p, n) ON CONFLICT DO NOTHING`,
		r.s(), catalog.TransactionReadsTable), r.group, topic, parts, offs); err != nil {
		return fmt.Errorf("recording the partitions of %s: %w", topic, err)
	}
	return nil
}
