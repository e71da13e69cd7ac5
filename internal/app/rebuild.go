package app

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"time"

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
		return fmt.Errorf("describing group %s: %w", cfg.Kafka.GroupID, err)
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
		return fmt.Errorf("reading high watermarks: %w", err)
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
		return nil, fmt.Errorf("listing Kafka's topics for the topic patterns: %w", err)
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

// swap replaces every live table by its rebuild in one transaction. The old
// tables stay, renamed <target>__replaced_<unix time>, so queries that
// resolved them before the swap finish on them; drop them when convenient.
// It returns the offsets to commit for the live group.
func swap(ctx context.Context, pool *pgxpool.Pool, cfg, rc *config.Config, log *zap.Logger) (kadm.Offsets, error) {
	now := time.Now().Unix()
	schema := cfg.Postgres.Schema
	id := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	bare := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	offsets := kadm.Offsets{}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		exec := func(q string, args ...any) error {
			if _, err := tx.Exec(ctx, q, args...); err != nil {
				return fmt.Errorf("swap: %s: %w", strings.SplitN(q, "\n", 2)[0], err)
			}
			return nil
		}
		// No statement of the swap may be cut by statement_timeout (the
		// carry rewrites whole tables); the locks still wait at most
		// lock_timeout.
		if err := exec(`SET LOCAL statement_timeout = 0`); err != nil {
			return err
		}
		// Surrogate keys first, for every table, before any live table is
		// locked: readers wait only for the renames.
		for i, t := range cfg.Tables {
			live, rb := t.Target, rc.Tables[i].Target
			var both bool
			if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL", id(live), id(rb)).Scan(&both); err != nil {
				return err
			}
			if !both {
				continue
			}
			carried, fresh, err := carryIDs(ctx, tx, schema, live, rb)
			if err != nil {
				return fmt.Errorf("swap: carrying the surrogate keys of %s over: %w", live, err)
			}
			log.Info("surrogate keys carried over", zap.String("table", live), zap.Int64("kept", carried), zap.Int64("new", fresh))
		}
		for i, t := range cfg.Tables {
			live, rb := t.Target, rc.Tables[i].Target
			L, R := catalog.NamesOf(live), catalog.NamesOf(rb)
			var exists bool
			if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", id(live)).Scan(&exists); err != nil {
				return err
			}
			var rbExists bool
			if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", id(rb)).Scan(&rbExists); err != nil {
				return err
			}
			if !rbExists {
				continue // its topic was empty
			}
			if exists {
				old := ReplacedTarget(live, now)
				O := catalog.NamesOf(old)
				if err := exec(fmt.Sprintf("LOCK TABLE %s, %s IN ACCESS EXCLUSIVE MODE", id(live), id(L.Side))); err != nil {
					return err
				}
				renames, err := catalog.PartitionRenames(ctx, tx, schema, live, old)
				if err != nil {
					return err
				}
				qs := append(renames,
					fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(L.IDIndex), bare(O.IDIndex)),
					fmt.Sprintf("DROP VIEW IF EXISTS %s", id(L.Current)),
					catalog.DropAsOfFunction(cfg.Postgres.Schema, live),
					fmt.Sprintf("ALTER TABLE %s RENAME TO %s", id(live), bare(old)),
					fmt.Sprintf("ALTER TABLE %s RENAME TO %s", id(L.Side), bare(O.Side)),
					// The key directory is a lookup aid of the written
					// table: the replaced one is not written again.
					fmt.Sprintf("DROP TABLE IF EXISTS %s", id(L.Dir)),
					fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(L.KeyIndex), bare(O.KeyIndex)),
					fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(L.SideIndex), bare(O.SideIndex)),
				)
				if len(L.OldSideIndex) <= 63 { // an index named before long targets were allowed
					qs = append(qs, fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(L.OldSideIndex), bare(O.SideIndex)))
				}
				for _, q := range qs {
					if err := exec(q); err != nil {
						return err
					}
				}
			}
			renames, err := catalog.PartitionRenames(ctx, tx, schema, rb, live)
			if err != nil {
				return err
			}
			for _, q := range append(renames,
				fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(R.IDIndex), bare(L.IDIndex)),
				fmt.Sprintf("ALTER TABLE %s RENAME TO %s", id(rb), bare(live)),
				fmt.Sprintf("ALTER TABLE %s RENAME TO %s", id(R.Side), bare(L.Side)),
				fmt.Sprintf("ALTER TABLE IF EXISTS %s RENAME TO %s", id(R.Dir), bare(L.Dir)),
				fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(R.DirKey), bare(L.DirKey)),
				fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(R.KeyIndex), bare(L.KeyIndex)),
				fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(R.SideIndex), bare(L.SideIndex)),
				fmt.Sprintf("ALTER VIEW %s RENAME TO %s", id(R.Current), bare(L.Current)),
				catalog.DropAsOfFunction(cfg.Postgres.Schema, rb),
				// The live audit of repairs stays; the replay's own is dropped.
				fmt.Sprintf("DROP TABLE IF EXISTS %s", id(R.Repairs)),
				catalog.DropAsOfFunction(cfg.Postgres.Schema, live),
				catalog.CreateAsOfFunction(cfg.Postgres.Schema, live, SinkConfig(cfg, zap.NewNop()).Tables[i].Deletes == sink.DeletesNewRecord),
			) {
				if err := exec(q); err != nil {
					return err
				}
			}
			// The views now read the rebuilt table.
			spec := SinkConfig(cfg, zap.NewNop()).Tables[i]
			spec.Schema = schema
			views, err := catalog.ViewStatements(ctx, tx, spec, live)
			if err != nil {
				return err
			}
			for _, q := range views {
				if err := exec(q); err != nil {
					return err
				}
			}
			if err := exec(fmt.Sprintf("DELETE FROM %s WHERE target = $1", id("scd2sink_truncates")), id(live)); err != nil {
				return err
			}
			if err := exec(fmt.Sprintf("UPDATE %s SET target = $1 WHERE target = $2", id("scd2sink_truncates")), id(live), id(rb)); err != nil {
				return err
			}
			// The snapshots the replay recorded, reconciled, held or
			// confirmed are the rebuilt table's: they replace the live ones.
			if err := exec(fmt.Sprintf("DELETE FROM %s WHERE consumer_group = $1 AND target = $2", id("scd2sink_snapshots")), cfg.Kafka.GroupID, live); err != nil {
				return err
			}
			if err := exec(fmt.Sprintf("UPDATE %s SET consumer_group = $1, target = $2 WHERE consumer_group = $3 AND target = $4", id("scd2sink_snapshots")),
				cfg.Kafka.GroupID, live, rc.Kafka.GroupID, rb); err != nil {
				return err
			}
			// Their notes of late events (sink/reconcile.go) go with them.
			if err := exec(fmt.Sprintf("DELETE FROM %s WHERE consumer_group = $1 AND target = $2", id("scd2sink_snapshots_late")), cfg.Kafka.GroupID, live); err != nil {
				return err
			}
			if err := exec(fmt.Sprintf("UPDATE %s SET consumer_group = $1, target = $2 WHERE consumer_group = $3 AND target = $4", id("scd2sink_snapshots_late")),
				cfg.Kafka.GroupID, live, rc.Kafka.GroupID, rb); err != nil {
				return err
			}
			// The replay's dead letters join the live ones (one already
			// waiting there for the same record is not repeated): a dead
			// letter replayed into the old table is pending again.
			dl, rdl := id(cfg.Sink.DeadLetterTable), id(rc.Sink.DeadLetterTable)
			if err := exec(fmt.Sprintf(`INSERT INTO %[1]s (topic, partition, "offset", target, key, value, error, created_at, headers, decoded)
				SELECT d.topic, d.partition, d."offset", $1, d.key, d.value, d.error, d.created_at, d.headers, d.decoded FROM %[2]s d
				WHERE d.target = $2 AND NOT EXISTS (SELECT 1 FROM %[1]s l WHERE l.topic = d.topic AND l.partition = d.partition
					AND l."offset" = d."offset" AND l.replayed_at IS NULL)`, dl, rdl), live, rb); err != nil {
				return err
			}
			if err := exec(fmt.Sprintf(`DELETE FROM %s WHERE target = $1`, rdl), rb); err != nil {
				return err
			}
		}
		if err := exec(fmt.Sprintf("DELETE FROM %s WHERE consumer_group = $1", id("scd2sink_offsets")), cfg.Kafka.GroupID); err != nil {
			return err
		}
		// Every writer fences (DESIGN.md section 6): an instance of the
		// group that remembers keys of the replaced tables forgets them.
		if err := exec(fmt.Sprintf(`INSERT INTO %s AS w (consumer_group, n) VALUES ($1, 1)
			ON CONFLICT (consumer_group) DO UPDATE SET n = w.n + 1`, id("scd2sink_outside_writes")), cfg.Kafka.GroupID); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, fmt.Sprintf("UPDATE %s SET consumer_group = $1 WHERE consumer_group = $2 RETURNING topic, partition, next_offset",
			id("scd2sink_offsets")), cfg.Kafka.GroupID, rc.Kafka.GroupID)
		if err != nil {
			return fmt.Errorf("swap: moving offsets: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var o kadm.Offset
			if err := rows.Scan(&o.Topic, &o.Partition, &o.At); err != nil {
				return err
			}
			o.LeaderEpoch = -1
			offsets.Add(o)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return offsets, nil
}

// carryIDs gives each version of the rebuilt table rb the scd_id of the
// live table's version opened by the same event (same key, same scd_seq),
// so that facts pointing into the history keep pointing at the same
// versions; versions the live table does not have get new ids from the
// live table's sequence, above every id it gave. It runs in the swap's
// transaction before the live table is locked (it only reads it: run is
// stopped during a rebuild), and returns how many ids were kept and given.
func carryIDs(ctx context.Context, tx pgx.Tx, schema, live, rb string) (int64, int64, error) {
	id := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	keys, err := sink.KeyColumns(ctx, tx, schema, live)
	if err != nil {
		return 0, 0, err
	}
	if len(keys) == 0 {
		return 0, 0, fmt.Errorf("%s has no key index %s", live, catalog.NamesOf(live).KeyIndex)
	}
	var liveSeq, rbSeq *string
	if err := tx.QueryRow(ctx, `SELECT pg_get_serial_sequence($1, 'scd_id'), pg_get_serial_sequence($2, 'scd_id')`, id(live), id(rb)).Scan(&liveSeq, &rbSeq); err != nil {
		return 0, 0, err
	}
	if liveSeq == nil || rbSeq == nil {
		return 0, 0, fmt.Errorf("scd_id of %s or %s is not an identity column", live, rb)
	}
	match := make([]string, len(keys))
	for i, k := range keys {
		// As text: a pre-created live table's key may have another type
		// than the rebuilt one's.
		match[i] = fmt.Sprintf("l.%[1]s::text = r.%[1]s::text", pgx.Identifier{k}.Sanitize())
	}
	var carried, fresh int64
	steps := []string{
		fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN scd_id SET GENERATED BY DEFAULT`, id(rb)),
		// Negative first: ids of the two tables overlap, and a unique
		// index is checked row by row.
		fmt.Sprintf(`UPDATE %s SET scd_id = -scd_id`, id(rb)),
	}
	for _, q := range steps {
		if _, err := tx.Exec(ctx, q); err != nil {
			return 0, 0, err
		}
	}
	if err := tx.QueryRow(ctx, fmt.Sprintf(`WITH m AS (
			SELECT r.scd_id AS tmp, l.scd_id AS kept FROM %[1]s r LEFT JOIN %[2]s l ON %[3]s AND l.scd_seq = r.scd_seq),
		u AS (UPDATE %[1]s r SET scd_id = coalesce(m.kept, nextval(%[4]s::regclass)) FROM m WHERE r.scd_id = m.tmp
			RETURNING m.kept IS NOT NULL AS kept)
		SELECT count(*) FILTER (WHERE kept), count(*) FILTER (WHERE NOT kept) FROM u`,
		id(rb), id(live), strings.Join(match, " AND "), catalog.QuoteLiteral(*liveSeq))).Scan(&carried, &fresh); err != nil {
		return 0, 0, err
	}
	// The rebuilt table's own sequence goes on above every id either gave.
	for _, q := range []string{
		fmt.Sprintf(`SELECT setval(%s::regclass, greatest((SELECT max(scd_id) FROM %s), (SELECT last_value FROM %s), 1))`,
			catalog.QuoteLiteral(*rbSeq), id(rb), *liveSeq),
		fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN scd_id SET GENERATED ALWAYS`, id(rb)),
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return 0, 0, err
		}
	}
	return carried, fresh, nil
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
