package catalog

import (
	"fmt"
	"time"

	"github.com/scd2sink/scd2sink/sink/fold"
)

// Column is one source column of a history table.
type Column struct {
	Name string
	// Type is a PostgreSQL type name used when the sink creates the table
	// ("text", "bigint", "numeric(10,2)", "timestamptz" ...). An existing
	// table's own column types win.
	Type string
}

// TableSpec describes one history table (one `tables` entry of the config).
type TableSpec struct {
	// Target is the history table's name; Schema its schema (default Config.Schema).
	Target string
	Schema string
	// ServiceSchema is the schema of the service's own tables (the
	// sink's Config.Schema), where the _consistent view finds
	// scd2sink_consistent_through.
	ServiceSchema string
	// Topic is the topic of an exact tables: entry ("" for a pattern's:
	// scd2sink_targets records those); erase and retention wait for its
	// writers.
	Topic string
	// Keys are the business key columns, in order; change.Event.Key follows it.
	// When empty, the first event's KeyNames (the Kafka key's fields) decide.
	Keys []string
	// Columns are the source columns (keys included) used to create the table.
	// Columns that appear in events but not here are added as they come,
	// with a type inferred from the value.
	Columns []Column
	// TrackHistory are the Type 2 columns; empty means every non-key column.
	TrackHistory []string
	// IgnoreColumns are never stored.
	IgnoreColumns []string
	Type1Scope    fold.Type1Scope
	Deletes       fold.DeletesMode
	// Retention removes the versions closed longer ago than it, with
	// their side rows (the sink's retention.go); 0 keeps everything.
	Retention time.Duration
	// Partitioning creates the history table partitioned (partition.go);
	// the zero value: a plain table.
	Partitioning Partitioning
	// SnapshotDeletes closes, when a full snapshot of the table completes,
	// the keys it did not read (DESIGN.md section 5).
	SnapshotDeletes bool
	// MaxCloseFraction guards reconciliation: one that would close more
	// than this fraction of the live keys is held until confirmed (0 or
	// 1 or more: no guard).
	MaxCloseFraction float64
	// FailOnSchemaChange (schema_changes: fail) stops the table's progress
	// at any change of the source schema but an added column: a dropped
	// column, or a changed type (DESIGN.md section 11).
	FailOnSchemaChange bool
	// NoOverlap (history_constraint: no_overlap) has PostgreSQL enforce
	// that no two versions of a key overlap (overlap.go).
	NoOverlap bool
	// Views are presentations of the history in other conventions,
	// created and replaced with the table.
	Views []ViewSpec
}

// Partitioning is how a history table the sink creates is partitioned:
// current versions in one partition, closed versions in one partition per
// Interval ("day", "month", "year"; "" for none) of their valid_to, Ahead
// intervals after the current one created in advance.
type Partitioning struct {
	Interval string
	Ahead    int
}

// DriftError is a history table or its bookkeeping that is not as the
// sink keeps it (a column or index dropped by hand, a corrupt value): it
// classifies as Blocked.
type DriftError struct {
	Table string
	What  string
}

// Error names the table and what drifted.
func (e *DriftError) Error() string { return fmt.Sprintf("history table %s: %s", e.Table, e.What) }
