package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/scd2sink/scd2sink/internal/kafkaerr"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
)

// resolvedTables is every table the configuration writes: the exact
// entries, and what the topic_pattern entries resolve the topics to that
// the group has applied (those in scd2sink_offsets), in target order.
func resolvedTables(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, router *config.Router) ([]config.Table, error) {
	var out []config.Table
	for _, t := range cfg.Tables {
		if t.TopicPattern == "" {
			out = append(out, t)
		}
	}
	if !router.HasPatterns() {
		return out, nil
	}
	if ok, err := tableExists(ctx, pool, cfg.Postgres.Schema, "scd2sink_offsets"); err != nil || !ok {
		return out, err // nothing applied yet: no topic of a pattern resolved
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT DISTINCT topic FROM %s.scd2sink_offsets WHERE consumer_group = $1 ORDER BY topic`,
		pgx.Identifier{cfg.Postgres.Schema}.Sanitize()), cfg.Kafka.GroupID)
	if err != nil {
		return nil, fmt.Errorf("reading the topics applied from scd2sink_offsets: %w", err)
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading the topics applied from scd2sink_offsets: %w", err)
	}
	for _, topic := range topics {
		if t, err := router.Resolve(topic); err == nil && t.TopicPattern != "" {
			out = append(out, t)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	return out, nil
}

// Tables prints every table the configuration writes, one line each, as
// an aligned table: the topic, its target, the key columns, the tracked
// columns, the number of versions, the records not yet applied (the log's
// end less scd2sink_offsets) and the completeness watermark. Topics come
// from Kafka (those the entries match, skipped ones with why) and from the
// exact entries; the rest from PostgreSQL.
func Tables(ctx context.Context, cfg *config.Config, opts Options, out io.Writer) error {
	pool, err := Pool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		// Else every figure from PostgreSQL would just read "-".
		return fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	adm, cl, err := opts.kafkaAdmin(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	listed, err := adm.ListTopics(ctx)
	if err != nil {
		return fmt.Errorf("listing Kafka's topics: %w", kafkaerr.Plain(err))
	}
	router := config.NewRouter(cfg)
	type line struct {
		topic string
		t     config.Table
		err   error
	}
	var lines []line
	seen := map[string]bool{}
	for _, topic := range listed.Names() {
		t, err := router.Resolve(topic)
		if errors.Is(err, config.ErrNoMatch) {
			continue
		}
		seen[topic] = true
		lines = append(lines, line{topic: topic, t: t, err: err})
	}
	for _, t := range cfg.Tables {
		if t.TopicPattern == "" && !seen[t.Topic] {
			lines = append(lines, line{topic: t.Topic, t: t, err: errors.New("no such topic in Kafka")})
		}
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].topic < lines[j].topic })
	var topics []string
	for _, l := range lines {
		topics = append(topics, l.topic)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return fmt.Errorf("listing the topics' end offsets: %w", kafkaerr.Plain(err))
	}
	schema := pgx.Identifier{cfg.Postgres.Schema}.Sanitize()
	applied := map[string]int64{}
	if rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT topic, sum(next_offset) FROM %s.scd2sink_offsets WHERE consumer_group = $1 GROUP BY topic`, schema), cfg.Kafka.GroupID); err == nil {
		for rows.Next() {
			var topic string
			var n int64
			if rows.Scan(&topic, &n) == nil {
				applied[topic] = n
			}
		}
		rows.Close()
	}
	marks := map[string]time.Time{}
	if rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT target, complete_through FROM %s.scd2sink_watermarks WHERE complete_through IS NOT NULL`, schema)); err == nil {
		for rows.Next() {
			var target string
			var at time.Time
			if rows.Scan(&target, &at) == nil {
				marks[target] = at
			}
		}
		rows.Close()
	}
	held := map[string]string{}
	if rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT target, held_keys, live_keys FROM %s.scd2sink_snapshots
		WHERE consumer_group = $1 AND held_at IS NOT NULL AND done_at IS NULL`, schema), cfg.Kafka.GroupID); err == nil {
		for rows.Next() {
			var target string
			var closing, live int64
			if rows.Scan(&target, &closing, &live) == nil {
				held[target] = fmt.Sprintf("reconciliation held: would close %d of %d live keys (scd2sink reconcile --table %s --confirm)", closing, live, target)
			}
		}
		rows.Close()
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "topic\ttarget\tkeys\ttracked\tversions\tlag\tcomplete_through\tnote")
	for _, l := range lines {
		if l.err != nil {
			fmt.Fprintf(tw, "%s\t-\t\t\t\t\t\tskipped: %v\n", l.topic, l.err)
			continue
		}
		keys := strings.Join(l.t.Keys, ",")
		versions := "-"
		if cols, err := sink.KeyColumns(ctx, pool, cfg.Postgres.Schema, l.t.Target); err == nil && len(cols) > 0 {
			if keys == "" {
				keys = strings.Join(cols, ",")
			}
			versions = countVersions(ctx, pool, pgx.Identifier{cfg.Postgres.Schema, l.t.Target}.Sanitize())
		}
		if keys == "" {
			keys = "(message key)"
		}
		tracked := strings.Join(l.t.TrackHistory, ",")
		if tracked == "" {
			tracked = "(all)"
		}
		var end int64
		ends.Each(func(o kadm.ListedOffset) {
			if o.Topic == l.topic && o.Err == nil {
				end += o.Offset
			}
		})
		lag := "-"
		if a, ok := applied[l.topic]; ok {
			lag = fmt.Sprint(max(end-a, 0))
		} else if end == 0 {
			lag = "0"
		}
		mark := "-"
		if at, ok := marks[l.t.Target]; ok {
			mark = at.UTC().Format(time.RFC3339Nano)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.topic, l.t.Target, keys, tracked, versions, lag, mark, held[l.t.Target])
	}
	return tw.Flush()
}

// exactBelow is the size under which versions are counted exactly; a
// larger table shows PostgreSQL's estimate (pg_class.reltuples), marked
// "~", so that listing hundreds of big tables stays quick.
const exactBelow = 1_000_000

// countVersions returns a table's number of rows: counted (within 10 s,
// else "?") below exactBelow, estimated above.
func countVersions(ctx context.Context, pool *pgxpool.Pool, table string) string {
	var est float64
	if err := pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)`, table).Scan(&est); err == nil && est >= exactBelow {
		return fmt.Sprintf("~%d", int64(est))
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int64
	if err := pool.QueryRow(cctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		return "?"
	}
	return fmt.Sprint(n)
}
