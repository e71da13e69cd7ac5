package app

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"time"

	"github.com/scd2sink/scd2sink/internal/kafkaerr"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/retry"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// RebuildMode says what a rebuild does besides replaying Kafka.
type RebuildMode struct {
	// Follow carries on as Run after the swap.
	Follow bool
	// FromScratch keeps only what Kafka holds: the live tables' versions
	// whose events Kafka no longer holds are not carried over (counted
	// and logged before the swap).
	FromScratch bool
}

// RebuildSuffix names the tables a rebuild fills next to the live ones.
const RebuildSuffix = "__rebuild"

// RebuildTarget is the table a rebuild of target fills: <target>__rebuild,
// or, for a target too long for that and its derived names to fit 63
// bytes, scd2sink_rebuild_<digest of target>.
func RebuildTarget(target string) string {
	if len(target)+len(RebuildSuffix) <= config.MaxTargetBytes {
		return target + RebuildSuffix
	}
	return "scd2sink_rebuild_" + digest(target)
}

// ReplacedTarget is what a swap renames the live table to, kept for
// queries still running on it: <target>__replaced_<unix time>, or
// scd2sink_replaced_<digest of target>_<unix time> for a long target.
func ReplacedTarget(target string, unix int64) string {
	if name := fmt.Sprintf("%s__replaced_%d", target, unix); len(name) <= config.MaxTargetBytes {
		return name
	}
	return fmt.Sprintf("scd2sink_replaced_%s_%d", digest(target), unix)
}

func digest(s string) string {
	h := fnv.New64a()
	h.Write([]byte(s))
	return fmt.Sprintf("%016x", h.Sum64())
}

// rebuildConfig is cfg aimed at the rebuild tables: every target with
// RebuildSuffix, its own consumer group starting from the earliest offset,
// its own dead-letter table, no HTTP endpoint, no views (the swap points
// the live views at the rebuilt tables).
func rebuildConfig(cfg *config.Config) *config.Config {
	rc := *cfg
	rc.Tables = append([]config.Table(nil), cfg.Tables...)
	for i := range rc.Tables {
		rc.Tables[i].Target = RebuildTarget(rc.Tables[i].Target)
		rc.Tables[i].Views = nil
		// The replay starts from the oldest schema: every change since
		// is one to follow, not to stop at.
		rc.Tables[i].SchemaChanges = "evolve"
		// Completeness is the live group's: a rebuild keeps no
		// transaction marks.
		rc.Tables[i].TransactionTopic = ""
	}
	rc.Kafka.GroupID = cfg.Kafka.GroupID + RebuildSuffix
	rc.Kafka.StartOffset = "earliest"
	rc.Rebuilding = true
	rc.Sink.DeadLetterTable = cfg.Sink.DeadLetterTable + RebuildSuffix
	empty := ""
	rc.HTTP.Addr = &empty
	return &rc
}

func (o Options) kafkaAdmin(cfg *config.Config) (*kadm.Client, *kgo.Client, error) {
	cl, err := o.kafkaClient(cfg)
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl, nil
}

// kafkaClient is a client of the configured cluster (TLS, SASL), with
// extra options.
func (o Options) kafkaClient(cfg *config.Config, extra ...kgo.Opt) (*kgo.Client, error) {
	tlsCfg, err := kafkaTLS(cfg)
	if err != nil {
		return nil, err
	}
	opts := []kgo.Opt{kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.ClientID(cfg.Kafka.ClientID)}
	if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	if m := kafkaSASL(cfg); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	opts = append(opts, extra...)
	return kgo.NewClient(append(opts, o.KafkaOpts...)...)
}

// Rebuild replays every configured topic from the earliest offset into fresh
// tables next to the live ones, reporting progress against the high
// watermarks taken at the start; when caught up it swaps the fresh tables in
// with one transaction (queries see the old or the new table, never
// neither), moves the offsets over and sets the live group's Kafka offsets.
// Before the swap it carries into the fresh tables every event of the live
// ones that the replay did not see (carryOver), unless mode.FromScratch.
// With mode.Follow it then carries on as Run. The live group must have no
// members (stop `scd2sink run` first).
func Rebuild(ctx context.Context, cfg *config.Config, opts Options, mode RebuildMode) error {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	adm, cl, err := opts.kafkaAdmin(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	live := cfg
	if cfg, err = expandPatterns(ctx, cfg, adm); err != nil {
		return err
	}
	groups, err := adm.DescribeGroups(ctx, cfg.Kafka.GroupID)
	if err != nil {
		return fmt.Errorf("describing group %s: %w", cfg.Kafka.GroupID, kafkaerr.Plain(err))
	}
	if g, ok := groups[cfg.Kafka.GroupID]; ok && len(g.Members) > 0 {
		return fmt.Errorf("group %s has %d active members: stop `scd2sink run` before rebuilding", cfg.Kafka.GroupID, len(g.Members))
	}
	var topics []string
	for _, t := range cfg.Tables {
		topics = append(topics, t.Topic)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return fmt.Errorf("reading the topics' end offsets: %w", kafkaerr.Plain(err))
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	pool, err := Pool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	rc := rebuildConfig(cfg)
	if err := resetRebuild(ctx, pool, adm, cfg, rc); err != nil {
		return err
	}
	if err := seedConfirmations(ctx, pool, cfg, rc); err != nil {
		return err
	}
	log.Info("rebuild started", zap.Int64("events", total), zap.Strings("topics", topics))

	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, rc, opts) }()
	start, lastLog := time.Now(), time.Time{}
	for {
		applied, caughtUp, err := rebuildProgress(ctx, pool, rc, ends)
		if err == nil && (caughtUp || time.Since(lastLog) >= 2*time.Second) {
			lastLog = time.Now()
			rate := float64(applied) / time.Since(start).Seconds()
			eta := time.Duration(0)
			if rate > 0 {
				eta = time.Duration(float64(total-applied)/rate) * time.Second
			}
			log.Info("rebuild progress", zap.Int64("applied", applied), zap.Int64("of", total),
				zap.Float64("events_per_s", float64(int64(rate))), zap.Duration("eta", eta.Round(time.Second)))
		}
		if caughtUp {
			break
		}
		select {
		case err := <-done:
			stop()
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("rebuild stopped before catching up: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	// The carry is tried again while the failure is transient or blocked
	// (a failover, a lock, a privilege put right): what a try carried is
	// in the rebuilt table and is not carried again.
	waits := retry.Policy{Classify: sink.Classify, Backoff: 500 * time.Millisecond, Max: 10 * time.Second}
	waits.OnRetry = func(_ int, _ retry.Class, err error, wait time.Duration) {
		log.Warn("carrying the live tables' versions over must wait; trying again", zap.Duration("wait", wait), zap.Error(err))
	}
	if _, err := waits.Do(ctx, func(ctx context.Context) error {
		return carryOver(ctx, pool, cfg, rc, mode.FromScratch, log, opts.beforeCarry)
	}); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("rebuild caught up but nothing was carried or swapped in (run it again): %w", ctx.Err())
		}
		return fmt.Errorf("rebuild caught up, but %w (nothing was swapped in)", err)
	}
	// The swap locks the live tables, waiting at most lock_timeout behind
	// a reader each try: it is tried again until it gets them (the replay
	// is done; a failed rebuild run again would start it over).
	var offsets kadm.Offsets
	waits.OnRetry = func(_ int, class retry.Class, err error, wait time.Duration) {
		what := "the swap must wait (a reader holds the live table, or PostgreSQL is unavailable); trying again"
		if class == sink.Blocked {
			what = "the swap is blocked by the database's objects or privileges (see the error); it goes on once that is put right, or stop it with SIGTERM"
		}
		log.Warn(what, zap.Duration("wait", wait), zap.Error(err))
	}
	if _, err := waits.Do(ctx, func(ctx context.Context) (err error) {
		offsets, err = swap(ctx, pool, cfg, rc, log)
		return err
	}); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("rebuild caught up but not swapped in (run it again): %w", ctx.Err())
		}
		return err
	}
	if len(offsets) > 0 {
		resp, err := adm.CommitOffsets(ctx, cfg.Kafka.GroupID, offsets)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			// scd2sink_offsets holds them; run resumes from there anyway.
			log.Warn("setting the group's offsets failed; run resumes from scd2sink_offsets", zap.Error(err))
		}
	}
	log.Info("rebuild swapped in", zap.Int64("events", total), zap.Duration("took", time.Since(start).Round(time.Millisecond)))
	if mode.Follow {
		return Run(ctx, live, opts)
	}
	return nil
}

// expandPatterns turns every topic_pattern entry into exact entries for
// the topics it matches in Kafka now (those a pattern takes later are
// `run`'s, as always); conflicts among them are a configuration error,
// as at run's start.
func expandPatterns(ctx context.Context, cfg *config.Config, adm *kadm.Client) (*config.Config, error) {
	router := config.NewRouter(cfg)
	if !router.HasPatterns() {
		return cfg, nil
	}
	listed, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing Kafka's topics for the topic patterns: %w", kafkaerr.Plain(err))
	}
	topics := listed.Names()
	if err := router.Check(topics); err != nil {
		return nil, err
	}
	out := *cfg
	out.Tables = nil
	for _, t := range cfg.Tables {
		if t.TopicPattern == "" {
			out.Tables = append(out.Tables, t)
		}
	}
	sort.Strings(topics)
	for _, topic := range topics {
		if t, err := router.Resolve(topic); err == nil && t.TopicPattern != "" {
			t.TopicPattern = ""
			out.Tables = append(out.Tables, t)
		}
	}
	return &out, nil
}

// resetRebuild removes what an interrupted earlier rebuild left, so the new
// one starts from empty tables and the earliest offsets.
func resetRebuild(ctx context.Context, pool *pgxpool.Pool, adm *kadm.Client, cfg, rc *config.Config) error {
	schema := pgx.Identifier{cfg.Postgres.Schema}.Sanitize()
	stmts := []string{}
	for _, t := range rc.Tables {
		n := catalog.NamesOf(t.Target)
		in := func(name string) string { return pgx.Identifier{cfg.Postgres.Schema, name}.Sanitize() }
		stmts = append(stmts,
			fmt.Sprintf("DROP VIEW IF EXISTS %s", in(n.Current)),
			fmt.Sprintf("DROP VIEW IF EXISTS %s", in(n.Consistent)),
			catalog.DropAsOfFunction(cfg.Postgres.Schema, t.Target),
			fmt.Sprintf("DROP TABLE IF EXISTS %s, %s, %s, %s", in(n.Hist), in(n.Side), in(n.Repairs), in(n.Dir)))
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, st := range stmts {
			if _, err := tx.Exec(ctx, st); err != nil {
				return err
			}
		}
		// The service tables may not exist yet on a fresh database.
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
			pgx.Identifier{cfg.Postgres.Schema, "scd2sink_offsets"}.Sanitize()).Scan(&exists); err != nil || !exists {
			return err
		}
		// What an interrupted rebuild recorded: its offsets (else the next
		// one would resume mid-topic into empty tables), its completed
		// snapshots and its dead letters.
		for _, table := range []string{"scd2sink_offsets", "scd2sink_snapshots", "scd2sink_snapshots_late", rc.Sink.DeadLetterTable} {
			name := pgx.Identifier{cfg.Postgres.Schema, table}.Sanitize()
			var found bool
			if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&found); err != nil {
				return err
			}
			q := "DELETE FROM " + name + " WHERE consumer_group = $1"
			args := []any{rc.Kafka.GroupID}
			if table == rc.Sink.DeadLetterTable {
				q, args = "DELETE FROM "+name, nil
			}
			if found {
				if _, err := tx.Exec(ctx, q, args...); err != nil {
					return err
				}
			}
		}
		for _, t := range rc.Tables {
			if _, err := tx.Exec(ctx, "DELETE FROM "+schema+".scd2sink_truncates WHERE target = $1",
				pgx.Identifier{cfg.Postgres.Schema, t.Target}.Sanitize()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("clearing an earlier rebuild: %w", err)
	}
	// The group's committed offsets go too. A rebuild killed a moment ago
	// is still a member until its session expires: wait for that, or the
	// next rebuild would resume from its offsets into empty tables.
	group := rc.Kafka.GroupID
	deadline := time.Now().Add(cfg.Kafka.SessionTimeout + 15*time.Second)
	for {
		resp, err := adm.DeleteGroups(ctx, group)
		if err != nil {
			return fmt.Errorf("resetting group %s: %w", group, err)
		}
		gerr := resp[group].Err
		if gerr == nil || errors.Is(gerr, kerr.GroupIDNotFound) {
			return nil
		}
		if !errors.Is(gerr, kerr.NonEmptyGroup) || time.Now().After(deadline) {
			return fmt.Errorf("resetting group %s: %w (is another rebuild running?)", group, gerr)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// rebuildProgress sums the rebuild's applied offsets and reports whether
// every partition has reached the high watermark taken at the start.
func rebuildProgress(ctx context.Context, pool *pgxpool.Pool, rc *config.Config, ends kadm.ListedOffsets) (int64, bool, error) {
	rows, err := pool.Query(ctx, fmt.Sprintf("SELECT topic, partition, next_offset FROM %s.scd2sink_offsets WHERE consumer_group = $1",
		pgx.Identifier{rc.Postgres.Schema}.Sanitize()), rc.Kafka.GroupID)
	if err != nil {
		return 0, false, err
	}
	defer rows.Close()
	at := map[string]map[int32]int64{}
	var applied int64
	for rows.Next() {
		var topic string
		var p int32
		var o int64
		if err := rows.Scan(&topic, &p, &o); err != nil {
			return 0, false, err
		}
		if at[topic] == nil {
			at[topic] = map[int32]int64{}
		}
		at[topic][p] = o
		applied += o
	}
	if err := rows.Err(); err != nil {
		return 0, false, err
	}
	caughtUp := true
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 && at[o.Topic][o.Partition] < o.Offset {
			caughtUp = false
		}
	})
	return applied, caughtUp, nil
}

// seedConfirmations gives the replay the live group's confirmations of
// reconciliations the guard held: the replay applies them as run did,
// rather than hold them again (and a swap would carry the hold over).
func seedConfirmations(ctx context.Context, pool *pgxpool.Pool, cfg, rc *config.Config) error {
	q := fmt.Sprintf(`INSERT INTO %s AS sn (consumer_group, target, scd_seq, valid_from, topic, until, held_at, held_keys, live_keys, confirmed_at)
		SELECT $1, $2, scd_seq, valid_from, topic, until, held_at, held_keys, live_keys, confirmed_at FROM %[1]s
		WHERE consumer_group = $3 AND target = $4 AND confirmed_at IS NOT NULL
		ON CONFLICT DO NOTHING`, pgx.Identifier{cfg.Postgres.Schema, "scd2sink_snapshots"}.Sanitize())
	for i, t := range cfg.Tables {
		_, err := pool.Exec(ctx, q, rc.Kafka.GroupID, rc.Tables[i].Target, cfg.Kafka.GroupID, t.Target)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703") {
			return nil // no snapshots recorded, or none ever held (an older installation)
		}
		if err != nil {
			return fmt.Errorf("carrying the confirmed reconciliations of %s over to the rebuild: %w", t.Target, err)
		}
	}
	return nil
}
