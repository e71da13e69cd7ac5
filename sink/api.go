package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/apply"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/plan"
	"go.uber.org/zap"
)

// Type1Scope says which versions of a key a Type 1 (untracked) change
// overwrites (fold.Type1Scope).
type Type1Scope = fold.Type1Scope

// The Type 1 scopes of DESIGN.md section 3.
const (
	AllVersions    = fold.AllVersions
	CurrentVersion = fold.CurrentVersion
)

// DeletesMode says what a delete does to the current version
// (fold.DeletesMode).
type DeletesMode = fold.DeletesMode

// The delete modes of DESIGN.md section 3.
const (
	DeletesClose     = fold.DeletesClose
	DeletesIgnore    = fold.DeletesIgnore
	DeletesNewRecord = fold.DeletesNewRecord
)

// Column is one source column of a history table (catalog.Column).
type Column = catalog.Column

// TableSpec describes one history table, one tables entry of the config
// (catalog.TableSpec).
type TableSpec = catalog.TableSpec

// Partitioning is how a history table the sink creates is partitioned
// (catalog.Partitioning).
type Partitioning = catalog.Partitioning

// ViewSpec is a presentation of a history table in another convention
// (catalog.ViewSpec).
type ViewSpec = catalog.ViewSpec

// DriftError is a history table that no longer matches what the sink
// knows of it (catalog.DriftError).
type DriftError = catalog.DriftError

// Index name suffixes of a history table (catalog.KeyIndexSuffix and
// the others).
const (
	KeyIndexSuffix     = catalog.KeyIndexSuffix
	SideIndexSuffix    = catalog.SideIndexSuffix
	OldSideIndexSuffix = catalog.OldSideIndexSuffix
	IDIndexSuffix      = catalog.IDIndexSuffix
	// DirSuffix and DirKeySuffix name a partitioned table's key
	// directory and its primary key.
	DirSuffix    = catalog.DirSuffix
	DirKeySuffix = catalog.DirKeySuffix
)

// Config is the sink's configuration.
type Config struct {
	// Schema holds the service's own tables and is the default for targets.
	Schema string
	// DeadLetterTable is the dead-letter table's name (default scd2sink_dead_letters).
	DeadLetterTable string
	// ConsumerGroup keys the rows of scd2sink_offsets.
	ConsumerGroup string
	// Tables are the history tables, keyed by change.Event.Table == Target.
	Tables []TableSpec
	// ReorderWindow is the sequencer's window: scd2sink_watermarks counts a
	// partition complete through the time it was last seen fully applied,
	// less this.
	ReorderWindow time.Duration
	// ErasureSecret keys the hashes of erased keys (erasure_key_file,
	// package erasure); ErasureAlias names the table this Sink writes the
	// history of a target erasures were recorded for (a rebuild's); nil:
	// the target itself.
	ErasureSecret []byte
	ErasureAlias  func(target string) string
	// DecodeKey reads a Kafka record's message key as the decoder reads
	// it for an event (its fields typed by the key's schema, JSON or
	// Avro): how erasure recognises the key of a record that was never
	// decoded, and the key a primary-key change's header names
	// (package erasure). nil: such keys are read as plain JSON.
	DecodeKey func(ctx context.Context, topic string, key []byte, headers []plan.Header) (vals []any, names []string, err error)
	// Resolve gives the spec of a target not in Tables (a topic matched by
	// a pattern): asked once per target, its answer kept when ok. It must
	// be safe for concurrent use and must not block.
	Resolve func(target string) (TableSpec, bool)
	// ApplyWorkers is how many transactions may apply one batch side by
	// side, each for a disjoint set of partitions (0 or 1: one; parallel.go).
	ApplyWorkers int
	// MaxRetries bounds the retries of one step of maintenance (erase,
	// retention, verify, partitions ahead, a reconciliation's chunk) on
	// transient errors (0 = 10). Batches are not retried by the Sink:
	// Apply returns the error, classified (Classify), and its caller
	// retries (the consumer; commands with internal/retry).
	MaxRetries int
	// MaxBackoff caps the wait between retries (0 = 5s).
	MaxBackoff time.Duration
	// CacheKeys bounds how many keys' latest state the Sink remembers between
	// batches (0 = 200,000; negative = none). See statecache.Cache.
	CacheKeys int
	// CacheBytes bounds the estimated memory of that state (0 = 32 MiB;
	// negative = no bound but CacheKeys).
	CacheBytes int
	// OnRetry is called with every error the Sink retries itself, before
	// it waits (scd2sink_retries_total, /readyz), and with a nil error
	// once a step it retried is over, whether it succeeded or not (the
	// stage waits no longer); stage is erase, retention, partitions,
	// verify or reconcile.
	OnRetry func(stage, what string, err error)
	Logger  *zap.Logger
}

// Position is what a batch records of one partition in scd2sink_offsets,
// true once its transaction commits: where reading goes on, and what the
// records below that point were.
type Position struct {
	// Offset is the next offset to read: every record below it is applied
	// (or dead-lettered) once the batch is.
	Offset int64
	// Anchor is the highest sequence of the records below Offset (see
	// Sink.Anchors); nil: the one recorded before stays.
	Anchor change.Seq
	// TopicID is the Kafka topic ID of the partition's topic: a topic
	// deleted and re-created has another ID, so its stored offsets are
	// known to be stale. "" keeps the ID recorded before; a recorded ID
	// that differs replaces the offset instead of keeping the higher one.
	TopicID string
	// Rewound marks an offset moved back on purpose (kafka.on_offset_lost
	// earliest or latest below the stored offset): the recorded offset is
	// replaced, not kept at the greater of the two.
	Rewound bool
	// Target is the target the partition's topic writes, and LastValid
	// the valid time of the last event below Offset (zero: none): the
	// completeness watermark (scd2sink_watermarks) is built from them.
	Target    string
	LastValid time.Time
}

// Offsets are the offsets of positions, per partition.
func Offsets(positions map[change.Partition]Position) map[change.Partition]int64 {
	out := make(map[change.Partition]int64, len(positions))
	for p, pos := range positions {
		out[p] = pos.Offset
	}
	return out
}

// At is positions at the given offsets and nothing more (tests, tools).
func At(offsets map[change.Partition]int64) map[change.Partition]Position {
	out := make(map[change.Partition]Position, len(offsets))
	for p, o := range offsets {
		out[p] = Position{Offset: o}
	}
	return out
}

// Batch is what one transaction applies: released events of any tables and
// keys (in any order; the sink sorts per key), dead letters from earlier
// stages, and the position per partition that becomes true once the
// transaction commits.
type Batch struct {
	Events      []*change.Event
	DeadLetters []plan.DeadLetter
	// Positions are recorded in scd2sink_offsets, one per partition.
	Positions map[change.Partition]Position
	// Confirm, when set, is called in the batch's transaction just before
	// it commits; an error rolls the transaction back and is returned.
	// The consumer confirms there that it still owns the batch's
	// partitions, so a member that lost them commits nothing more.
	Confirm func(ctx context.Context) error
	// Snapshots are the full snapshots completed by the batch's events
	// (an event with SnapshotEnd of a table with SnapshotDeletes); they are
	// recorded in the batch's transaction and reconciled once every
	// partition of their topic has been applied past Until.
	Snapshots []Snapshot
	// Lock names partitions whose writers the batch excludes without
	// recording offsets for them (reconciliation's deletes, replays).
	Lock []change.Partition
	// LockTargets names targets whose every writer the batch excludes,
	// as erase and retention do (every group that recorded progress on
	// their topics, every partition): an import writes keys that run may
	// be writing. Each lock waits at most lock_timeout.
	LockTargets []string
	// Replay, for a replay of dead letters (ledger_replay.go), names the
	// dead-letter rows of each event's origin: marked replayed in the
	// batch's transaction, or given the new error if rejected again.
	Replay map[change.Origin][]int64
	// Outside marks a batch that writes history outside the batch path
	// (a snapshot reconciliation's deletes): its transaction bumps the
	// outside-writes count, so that every running writer's fence forgets
	// what it remembers of the keys (DESIGN.md section 6: every writer
	// fences).
	Outside bool
}

// Snapshot is a completed full snapshot of a table.
type Snapshot struct {
	Target string
	Seq    change.Seq // the snapshot's sequence
	At     time.Time  // the snapshot's time: its deletes' valid-from
	Topic  string
	// Until holds, per partition of Topic, the offset every snapshot
	// record is below (the high watermarks when its last record was read).
	Until map[int32]int64
}

func (c *Config) defaults() error {
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.DeadLetterTable == "" {
		c.DeadLetterTable = "scd2sink_dead_letters"
	}
	if c.ConsumerGroup == "" {
		c.ConsumerGroup = "scd2sink"
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = 10
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.CacheKeys == 0 {
		c.CacheKeys = 200_000
	}
	if c.CacheBytes == 0 {
		c.CacheBytes = 32 << 20
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	seen := map[string]bool{}
	for i := range c.Tables {
		t := &c.Tables[i]
		if t.Target == "" {
			return fmt.Errorf("table %d: target is empty", i+1)
		}
		if seen[t.Target] {
			return fmt.Errorf("table %s: target appears twice", t.Target)
		}
		seen[t.Target] = true
		if err := c.specDefaults(t); err != nil {
			return err
		}
	}
	return nil
}

// specDefaults fills and checks one spec's defaults.
func (c *Config) specDefaults(t *TableSpec) error {
	{
		if t.Schema == "" {
			t.Schema = c.Schema
		}
		t.ServiceSchema = c.Schema
		if t.Type1Scope == "" {
			t.Type1Scope = AllVersions
		}
		if t.Type1Scope != AllVersions && t.Type1Scope != CurrentVersion {
			return fmt.Errorf("table %s: type1_scope %q is not all_versions or current_version", t.Target, t.Type1Scope)
		}
		if t.Deletes == "" {
			t.Deletes = DeletesClose
		}
		if t.Deletes != DeletesClose && t.Deletes != DeletesIgnore && t.Deletes != DeletesNewRecord {
			return fmt.Errorf("table %s: deletes %q is not close, ignore or new_record", t.Target, t.Deletes)
		}
	}
	return nil
}

// DeadLetter is an event that could not be applied (plan.DeadLetter).
type DeadLetter = plan.DeadLetter

// Header is a Kafka record header kept with a dead letter (plan.Header).
type Header = plan.Header

// Why an event is a dead letter (DeadLetter.Reason; see plan's).
const (
	ReasonDecode       = plan.ReasonDecode
	ReasonConflict     = plan.ReasonConflict
	ReasonTypeMismatch = plan.ReasonTypeMismatch
	ReasonRejected     = plan.ReasonRejected
	ReasonInvalid      = plan.ReasonInvalid
	ReasonNoTable      = plan.ReasonNoTable
	ReasonExpired      = plan.ReasonExpired
)

// Stored marks v as read back from a history table's column (plan.Stored).
func Stored(v any) any { return plan.Stored(v) }

// Result counts what one Apply did (apply.Result).
type Result = apply.Result

// DeadNote is what a batch's transaction wrote of one dead letter
// (apply.DeadNote).
type DeadNote = apply.DeadNote

// Disagreement is a pair of a key's events that its sequence and their
// valid times order differently (apply.Disagreement).
type Disagreement = apply.Disagreement
