package plan

import (
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/catalog"
)

// DeadLetter is an event that could not be applied. It is written to the
// dead-letter table in the same transaction as the batch it arrived with.
type DeadLetter struct {
	Origin change.Origin
	Table  string
	Key    []byte
	Value  []byte
	// Headers are the record's Kafka headers: Apicurio's schema ids and
	// Debezium's key-change headers are needed to decode it again.
	Headers []Header
	Err     string
	// Decoded marks a dead letter of an event rejected after decoding (a
	// value PostgreSQL refused, a conflict): Key and Value are then its
	// decoded form (Planner.Plan), not the record's bytes; a replay reads the
	// record again from Kafka by its coordinates.
	Decoded bool
	// Reason is why it is a dead letter (one of the Reason constants): the
	// reason label of scd2sink_events_dead_lettered_total.
	Reason string
	// KeyID is the identity of the event's key when it converted (an
	// erased key's dead letters are dropped too); KeyCols, for one
	// without, are its table's key columns, to read its key back with
	// (package erasure). The sink's Prepare sets them; a caller handing
	// dead letters to the sink leaves them empty (the erasure filter
	// trusts KeyID).
	KeyID   string
	KeyCols []catalog.ColumnInfo
}

// Why an event is a dead letter (DeadLetter.Reason).
const (
	ReasonDecode       = "decode"        // the record cannot be decoded (not Debezium, a schema unknown, no key or sequence)
	ReasonConflict     = "conflict"      // another event of the key has the same sequence and other content
	ReasonTypeMismatch = "type_mismatch" // a value does not fit its history column's type
	ReasonRejected     = "rejected"      // PostgreSQL rejected a value (SQLSTATE class 22 or 23)
	ReasonInvalid      = "invalid"       // the event cannot be applied (its key or image does not fit the table)
	ReasonNoTable      = "no_table"      // no table, or no key columns, for the event
	ReasonExpired      = "expired"       // a late event before what retention kept of its key
)

// Header is a Kafka record header, kept with a dead letter (as JSON, the
// value in base64).
type Header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}
