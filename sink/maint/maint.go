// Package maint is the upkeep of the history beside its writers:
// retention (DESIGN.md section 12), verify (section 5's invariants),
// partitions created ahead and emptied ones dropped, and the claims that
// decide which topic writes a target.
//
// It works on the tables through package catalog and reaches the writers
// only through Writer. Every transaction that changes history first takes
// the locks of every writer of the target (Writer.LockWriters, waiting at
// most lock_timeout, in the fences' order), so a batch and a maintenance
// transaction never interleave; what changed history behind the writers'
// backs is announced once (Writer.NoteOutsideWrite), so that every
// writer's fence forgets what it remembers of the keys. Nothing here is
// kept between calls: each reads the catalog and the tables as they are,
// which is why a pass that failed midway is simply run again.
package maint

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"go.uber.org/zap"
)

// Writer is what maintenance needs of the service's writers (package
// sink's Sink). Its methods are safe to call while batches are applied;
// LockWriters and NoteOutsideWrite run in the caller's transaction and
// own nothing past it.
type Writer interface {
	// Spec returns target's spec, asking the configuration's patterns
	// for a target not known yet.
	Spec(target string) (catalog.TableSpec, bool)
	// Specs lists the specs of every target known so far.
	Specs() []catalog.TableSpec
	// Table is the writers' description of target's history table (nil:
	// none loaded yet).
	Table(target string) *catalog.Table
	// Partitioned lists the partitions of every partitioned history
	// table the writers have loaded.
	Partitioned() []*catalog.Partitions
	// LockWriters takes, in tx, the advisory locks of every writer of
	// targets (every consumer group, every partition of their topics).
	LockWriters(ctx context.Context, tx pgx.Tx, spec catalog.TableSpec, targets []string) error
	// NoteOutsideWrite bumps, in tx, the outside-writes count every
	// writer's fence reads.
	NoteOutsideWrite(ctx context.Context, tx pgx.Tx) error
	// Watermarks reads the completeness watermark per target.
	Watermarks(ctx context.Context) (map[string]time.Time, error)
	// ErasedViolations lists the erased keys that still have versions in
	// the history table hist of spec.
	ErasedViolations(ctx context.Context, spec catalog.TableSpec, hist string) ([]Violation, error)
}

// Tuning holds the sizes and hooks of retention; read at each use, so a
// test may change them before a pass.
type Tuning struct {
	// RetentionChunk is how many keys one retention transaction handles;
	// RetentionWindow how many rows one retention pick reads;
	// AfterRetentionPick, when set, is called with the phase after each
	// pick, before the chunk's lock.
	RetentionChunk     int
	RetentionWindow    int
	AfterRetentionPick func(phase string)
}

// DefaultTuning is the service's tuning.
func DefaultTuning() Tuning { return Tuning{RetentionChunk: 1000, RetentionWindow: 50_000} }

// Config is what maintenance is told.
type Config struct {
	// Schema holds the service's tables; ConsumerGroup keys this
	// group's claims.
	Schema, ConsumerGroup string
	// Patterns says whether targets may come from topic patterns (their
	// claims are read by RetainedTargets).
	Patterns bool
	Logger   *zap.Logger
	// Retry runs a step (stage and what name it), retrying transient
	// errors with the writers' policy (internal/retry).
	Retry func(ctx context.Context, stage, what string, fn func(context.Context) error) (int, error)
	// Tuning are the sizes and hooks (nil: DefaultTuning).
	Tuning *Tuning
}

// Maint runs maintenance on the history tables of the writers w.
type Maint struct {
	cfg  Config
	pool *pgxpool.Pool
	w    Writer
}

// New returns maintenance for the writers w, through pool.
func New(cfg Config, pool *pgxpool.Pool, w Writer) *Maint {
	if cfg.Tuning == nil {
		t := DefaultTuning()
		cfg.Tuning = &t
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Retry == nil {
		cfg.Retry = func(ctx context.Context, _, _ string, fn func(context.Context) error) (int, error) { return 0, fn(ctx) }
	}
	return &Maint{cfg: cfg, pool: pool, w: w}
}

// table is the description of spec's history table: the writers', or
// read from the catalog (nil when the table does not exist yet).
func (m *Maint) table(ctx context.Context, spec catalog.TableSpec) (*catalog.Table, error) {
	if t := m.w.Table(spec.Target); t != nil {
		return t, nil
	}
	var exists bool
	if err := m.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{spec.Schema, spec.Target}.Sanitize()).Scan(&exists); err != nil {
		return nil, err
	}
	if !exists {
		return nil, nil
	}
	if len(spec.Keys) == 0 {
		keys, err := catalog.KeyColumns(ctx, m.pool, spec.Schema, spec.Target)
		if err != nil {
			return nil, err
		}
		spec.Keys = keys
	}
	return catalog.Ensure(ctx, m.pool, spec, nil)
}

// sqlState is err's SQLSTATE ("" when it has none).
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// bytesOf is v as bytes (nil when it is not).
func bytesOf(v any) []byte {
	b, _ := v.([]byte)
	return b
}
