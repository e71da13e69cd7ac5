package app

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
)

// ErrNothingHeld is Reconcile's error when the guard holds no
// reconciliation of the table.
var ErrNothingHeld = fmt.Errorf("no reconciliation of the table is held")

// Reconcile prints the snapshot reconciliations of target that the guard
// (snapshot_deletes_max_fraction) holds and, with confirm, applies them:
// the keys each snapshot did not read are closed as of the snapshot, as
// late deletes (an instance running meanwhile is not disturbed). Without
// confirm it is a configuration error (exit 2) naming --confirm.
func Reconcile(ctx context.Context, cfg *config.Config, opts Options, target string, confirm bool, out io.Writer) error {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if err := noRebuild(ctx, cfg, opts); err != nil {
		return err
	}
	pool, err := Pool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if ok, err := tableExists(ctx, pool, cfg.Postgres.Schema, "scd2sink_snapshots"); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("%s: %w: %s", target, ErrNothingHeld, notWrittenYet(cfg.Postgres.Schema))
	}
	s, err := commandSink(ctx, cfg, pool, debezium.New(nil, nil, nil), log)
	if err != nil {
		return err
	}
	held, err := s.HeldReconciliations(ctx, target)
	if err != nil {
		return err
	}
	if len(held) == 0 {
		return fmt.Errorf("%s: %w", target, ErrNothingHeld)
	}
	for _, h := range held {
		fmt.Fprintf(out, "%s: the snapshot of %s, held since %s, closes %d of %d live keys\n", h.Target,
			h.At.UTC().Format(time.RFC3339Nano), h.HeldAt.UTC().Format(time.RFC3339), h.Closing, h.Live)
	}
	if !confirm {
		return &config.Error{Key: "--confirm", Msg: "is required to apply the reconciliation"}
	}
	// A running instance may take the confirmed reconciliation up first
	// (it looks about once a second): this one then skips it, and waits
	// for that one to finish it.
	deadline := time.Now().Add(confirmWait)
	for {
		if _, err := s.Confirm(ctx, target); err != nil {
			return err
		}
		left, err := s.HeldReconciliations(ctx, target)
		if err != nil {
			return err
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d reconciliations still held %s after confirming (confirmed: a running instance applies them, or run this again)",
				target, len(left), confirmWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	fmt.Fprintf(out, "%s: applied\n", target)
	return nil
}

// confirmWait bounds how long reconcile --confirm waits for a running
// instance that took the confirmed reconciliation up first.
const confirmWait = 2 * time.Minute

// heldGauge is scd2sink_reconciliations_held: the snapshot
// reconciliations the guard holds, read from scd2sink_snapshots at each
// scrape (within 2 s; the last value when PostgreSQL does not answer).
func heldGauge(s *sink.Sink) prometheus.Collector {
	var last atomic.Int64
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "scd2sink_reconciliations_held",
		Help: "Snapshot reconciliations held by snapshot_deletes_max_fraction until `scd2sink reconcile --confirm`."},
		func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if held, err := s.HeldReconciliations(ctx, ""); err == nil {
				last.Store(int64(len(held)))
			}
			return float64(last.Load())
		})
}

// commandSink is the sink of a command that writes beside run (reconcile,
// dead-letters replay): every target the configuration resolved so far,
// its tables brought up to date.
func commandSink(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, dec *debezium.Decoder, log *zap.Logger) (*sink.Sink, error) {
	router := config.NewRouter(cfg)
	if _, err := resolvedTables(ctx, pool, cfg, router); err != nil {
		return nil, err
	}
	sc := SinkConfig(cfg, log.Named("sink"))
	Route(cfg, router, dec, &sc)
	sc.DecodeKey = keyDecoder(dec)
	s, err := sink.New(sc, pool)
	if err != nil {
		return nil, &config.Error{Msg: err.Error()}
	}
	if err := retried(ctx, s.Init); err != nil {
		return nil, err
	}
	return s, nil
}
