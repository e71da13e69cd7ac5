package app

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/scd2sink/scd2sink/sink/carry"
	"go.uber.org/zap"
)

// carryChunk bounds the events one carrying transaction applies.
const carryChunk = 2000

// carryOver gives each rebuilt table the live table's events that the
// replay did not see (package carry: Kafka's retention, compaction or a
// deletion of records lost them), applied through the rebuild's own sink
// as late events, so that the rebuilt history is the fold of both
// (DESIGN.md section 13). With fromScratch it only counts them and says
// before the swap what the swap drops. A target whose live or rebuilt
// table does not exist has nothing to carry (the swap leaves a live
// table without a rebuilt one as it is).
func carryOver(ctx context.Context, pool *pgxpool.Pool, cfg, rc *config.Config, fromScratch bool, log *zap.Logger, before func()) error {
	if before != nil {
		before()
	}
	var s *sink.Sink
	for i, t := range cfg.Tables {
		p := carry.Pair{Schema: cfg.Postgres.Schema, Live: t.Target, Into: rc.Tables[i].Target}
		var both bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL",
			pgx.Identifier{p.Schema, p.Live}.Sanitize(), pgx.Identifier{p.Schema, p.Into}.Sanitize()).Scan(&both); err != nil {
			return fmt.Errorf("looking for %s and its rebuild: %w", p.Live, err)
		}
		if !both {
			continue
		}
		if fromScratch {
			c, err := carry.Count(ctx, pool, p)
			if err != nil {
				return err
			}
			if c.Events > 0 {
				log.Warn("rebuild --from-scratch: only what Kafka holds is swapped in; the live table's events Kafka no longer holds are dropped "+
					"(the live table stays as "+t.Target+"__replaced_<time> until dropped)",
					zap.String("table", t.Target), zap.Int64("versions_dropped", c.Versions), zap.Int64("events_dropped", c.Events))
			}
			continue
		}
		if s == nil {
			var err error
			if s, err = sink.New(SinkConfig(rc, log.Named("carry")), pool); err != nil {
				return &config.Error{Msg: err.Error()}
			}
			if err := s.Init(ctx); err != nil {
				return err // rebuild's loop tries the carry again
			}
		}
		c, err := carry.Read(ctx, pool, p, carryChunk, func(evs []*change.Event) error {
			if _, err := s.Apply(ctx, sink.Batch{Events: evs, Outside: true}); err != nil {
				return fmt.Errorf("applying %d carried events to %s: %w", len(evs), p.Into, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("carrying the versions of %s that Kafka no longer holds: %w", t.Target, err)
		}
		log.Info("rebuild: carried over what Kafka no longer holds", zap.String("table", t.Target),
			zap.Int64("versions", c.Versions), zap.Int64("events", c.Events), zap.Int64("truncates", c.Truncates))
	}
	return nil
}
