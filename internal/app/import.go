package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/scd2sink/scd2sink/sink/carry"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// ImportQuery is what `scd2sink import` was asked.
type ImportQuery struct {
	Table string // the target (or its topic)
	From  string // SCHEMA.TABLE of the SCD2 table to import
	// Layout is "dbt", or "" with ValidFrom and ValidTo naming the
	// interval columns.
	Layout             string
	ValidFrom, ValidTo string
	DryRun             bool
}

// importChunk bounds the events one import transaction applies.
const importChunk = 10000

// ErrInvalidImport is returned when the table to import holds versions
// import refuses (listed on the output).
var ErrInvalidImport = errors.New("the table holds invalid versions: fix them, then import again (nothing was written)")

// Import seeds a target's history from an SCD2 table kept elsewhere
// (DESIGN.md section 13; package carry): it checks every version first and
// refuses a table with invalid ones, then applies the versions through
// the normal path in transactions of importChunk events, each fenced like
// every writer and excluding the target's writers (it may run beside
// run). With DryRun it prints what it would write and writes nothing.
func Import(ctx context.Context, cfg *config.Config, opts Options, q ImportQuery, out io.Writer) error {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	schemaName, tableName, ok := strings.Cut(q.From, ".")
	if !ok || schemaName == "" || tableName == "" {
		return &config.Error{Key: "--from", Msg: fmt.Sprintf("%q is not SCHEMA.TABLE", q.From)}
	}
	var layout carry.Layout
	switch {
	case q.Layout == "dbt" && q.ValidFrom == "" && q.ValidTo == "":
		layout = carry.DBT
	case q.Layout == "" && q.ValidFrom != "" && q.ValidTo != "":
		layout = carry.Layout{ValidFrom: q.ValidFrom, ValidTo: q.ValidTo}
	case q.Layout != "" && q.Layout != "dbt":
		return &config.Error{Key: "--layout", Msg: fmt.Sprintf("%q is not a layout scd2sink knows (dbt; or name the columns with --valid-from and --valid-to)", q.Layout)}
	default:
		return &config.Error{Key: "--layout", Msg: "give --layout dbt, or both --valid-from and --valid-to"}
	}
	pool, err := Pool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	tables, err := resolvedTables(ctx, pool, cfg, config.NewRouter(cfg))
	if err != nil {
		return err
	}
	var entry *config.Table
	for i, t := range tables {
		if t.Target == q.Table || t.Topic == q.Table {
			entry = &tables[i]
		}
	}
	if entry == nil {
		return &config.Error{Key: "--table", Msg: fmt.Sprintf("%q is neither a target nor a topic of the configuration", q.Table)}
	}
	if !q.DryRun {
		if err := noRebuild(ctx, cfg, opts); err != nil {
			return err
		}
	}
	spec := tableSpec(cfg, *entry)
	keys := spec.Keys
	if len(keys) == 0 {
		if keys, err = sink.KeyColumns(ctx, pool, cfg.Postgres.Schema, entry.Target); err != nil {
			return err
		}
	}
	f := carry.Foreign{Schema: schemaName, Table: tableName, Layout: layout, Keys: keys, Ignore: spec.IgnoreColumns,
		TargetSchema: cfg.Postgres.Schema, Target: entry.Target}
	invalid, total, err := carry.Check(ctx, pool, f)
	if err != nil {
		return err
	}
	if total > 0 {
		fmt.Fprintf(out, "%d invalid versions in %s (key, valid_from, valid_to, why):\n", total, q.From)
		for _, iv := range invalid {
			fmt.Fprintf(out, "  %s\t%s\t%s\t%s\n", iv.Key, iv.ValidFrom, iv.ValidTo, iv.Why)
		}
		if int64(len(invalid)) < total {
			fmt.Fprintf(out, "  … and %d more\n", total-int64(len(invalid)))
		}
		return fmt.Errorf("import of %s into %s: %w", q.From, entry.Target, ErrInvalidImport)
	}
	if q.DryRun {
		shown := 0
		c, err := carry.ReadImport(ctx, pool, f, importChunk, func(evs []*change.Event) error {
			for _, e := range evs {
				if shown < 50 {
					fmt.Fprintf(out, "  %s\t%s\t%s\n", keyText(e.Key), e.Op, e.ValidFrom.UTC().Format(time.RFC3339Nano))
				}
				shown++
			}
			return nil
		})
		if err != nil {
			return err
		}
		if shown > 50 {
			fmt.Fprintf(out, "  … and %d more events\n", shown-50)
		}
		fmt.Fprintf(out, "dry run: would import %s into %s: %d keys, %d versions, %d deletes; no invalid version\n",
			q.From, entry.Target, c.Keys, c.Versions, c.Deletes)
		return nil
	}
	s, err := commandSink(ctx, cfg, pool, debezium.New(nil, nil, nil), log)
	if err != nil {
		return err
	}
	start := time.Now()
	var res sink.Result
	// Three stages side by side: reading the table, preparing a chunk
	// (conversion, plan) and applying the one before it in PostgreSQL.
	g, gctx := errgroup.WithContext(ctx)
	chunks := make(chan []*change.Event, 1)
	var c carry.ImportCounts
	g.Go(func() error {
		defer close(chunks)
		var err error
		c, err = carry.ReadImport(gctx, pool, f, importChunk, func(evs []*change.Event) error {
			select {
			case chunks <- evs:
				return nil
			case <-gctx.Done():
				return gctx.Err()
			}
		})
		return err
	})
	g.Go(func() error {
		var applying chan error
		wait := func() error {
			if applying == nil {
				return nil
			}
			err := <-applying
			applying = nil
			return err
		}
		for evs := range chunks {
			var p *sink.Prepared
			err := retried(gctx, func(ctx context.Context) (err error) {
				p, err = s.Prepare(ctx, sink.Batch{Events: evs, Outside: true, LockTargets: []string{entry.Target}})
				return err
			})
			if err != nil {
				_ = wait() // the chunk in flight ends before the import does
				return fmt.Errorf("importing into %s: %w", entry.Target, err)
			}
			if err := wait(); err != nil {
				return err
			}
			applying = make(chan error, 1)
			go func() {
				var r sink.Result
				err := retried(gctx, func(ctx context.Context) (err error) {
					r, err = s.ApplyPrepared(ctx, p)
					return err
				})
				if err != nil {
					err = fmt.Errorf("importing into %s: %w", entry.Target, err)
				}
				res.Events += r.Events
				res.Duplicates += r.Duplicates
				res.DeadLetters += r.DeadLetters
				res.VersionsOpened += r.VersionsOpened
				applying <- err
			}()
		}
		return wait()
	})
	if err := g.Wait(); err != nil {
		return err
	}
	took := time.Since(start)
	fmt.Fprintf(out, "imported %s into %s: %d keys, %d versions, %d deletes in %s (%.0f versions/s); %d versions opened, %d events already there, %d dead letters\n",
		q.From, entry.Target, c.Keys, c.Versions, c.Deletes, took.Round(time.Millisecond), float64(c.Versions)/took.Seconds(),
		res.VersionsOpened, res.Duplicates, res.DeadLetters)
	log.Info("import done", zap.String("from", q.From), zap.String("target", entry.Target), zap.Int64("keys", c.Keys),
		zap.Int64("versions", c.Versions), zap.Int64("deletes", c.Deletes), zap.Duration("took", took))
	return nil
}

// keyText renders key values read back from a table, for a dry run.
func keyText(key []any) string {
	parts := make([]string, len(key))
	for i, k := range key {
		parts[i] = fmt.Sprint(k)
	}
	return strings.Join(parts, ",")
}
