package app

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/twmb/franz-go/pkg/kadm"
	"go.uber.org/zap"
)

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
		// The dead letters' reason goes with them where the live table has
		// the column (a live table of an older release gains it at the
		// next start).
		var reasonCol bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'reason' AND NOT attisdropped)`,
			id(cfg.Sink.DeadLetterTable)).Scan(&reasonCol); err != nil {
			return fmt.Errorf("swap: looking up the dead letters' columns: %w", err)
		}
		reasonIn, reasonOut := "", ""
		if reasonCol {
			reasonIn, reasonOut = ", reason", ", d.reason"
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
					// The no-overlap constraint goes with its index's name.
					fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(L.Exclusion), bare(O.Exclusion)),
					fmt.Sprintf("DROP VIEW IF EXISTS %s", id(L.Current)),
					fmt.Sprintf("DROP VIEW IF EXISTS %s", id(L.Consistent)),
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
				fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(R.Exclusion), bare(L.Exclusion)),
				fmt.Sprintf("ALTER TABLE %s RENAME TO %s", id(rb), bare(live)),
				fmt.Sprintf("ALTER TABLE %s RENAME TO %s", id(R.Side), bare(L.Side)),
				fmt.Sprintf("ALTER TABLE IF EXISTS %s RENAME TO %s", id(R.Dir), bare(L.Dir)),
				fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(R.DirKey), bare(L.DirKey)),
				fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(R.KeyIndex), bare(L.KeyIndex)),
				fmt.Sprintf("ALTER INDEX IF EXISTS %s RENAME TO %s", id(R.SideIndex), bare(L.SideIndex)),
				fmt.Sprintf("ALTER VIEW %s RENAME TO %s", id(R.Current), bare(L.Current)),
				fmt.Sprintf("ALTER VIEW IF EXISTS %s RENAME TO %s", id(R.Consistent), bare(L.Consistent)),
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
			if err := exec(fmt.Sprintf(`INSERT INTO %[1]s (topic, partition, "offset", target, key, value, error, created_at, headers, decoded%[3]s)
				SELECT d.topic, d.partition, d."offset", $1, d.key, d.value, d.error, d.created_at, d.headers, d.decoded%[4]s FROM %[2]s d
				WHERE d.target = $2 AND NOT EXISTS (SELECT 1 FROM %[1]s l WHERE l.topic = d.topic AND l.partition = d.partition
					AND l."offset" = d."offset" AND l.replayed_at IS NULL)`, dl, rdl, reasonIn, reasonOut), live, rb); err != nil {
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
