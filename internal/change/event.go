// Package change defines the change event that flows through scd2sink's
// stages: the consumer builds it from a Kafka record, the sequencer orders it
// per key, and the sink folds it into a history table.
package change

import (
	"encoding/json"
	"fmt"
	"time"
	"unsafe"

	"github.com/scd2sink/scd2sink/debezium/jsonscan"
	"github.com/tidwall/gjson"
)

// Op is a change operation as Debezium names it.
type Op byte

// The operations scd2sink understands.
const (
	OpCreate   Op = 'c'
	OpRead     Op = 'r' // snapshot read
	OpUpdate   Op = 'u'
	OpDelete   Op = 'd'
	OpTruncate Op = 't'
)

// ParseOp maps Debezium's op field to an Op.
func ParseOp(s string) (Op, error) {
	if len(s) == 1 {
		switch op := Op(s[0]); op {
		case OpCreate, OpRead, OpUpdate, OpDelete, OpTruncate:
			return op, nil
		}
	}
	return 0, fmt.Errorf("unknown operation %q", s)
}

// HasAfter reports whether events of this operation carry an after image.
func (o Op) HasAfter() bool { return o == OpCreate || o == OpRead || o == OpUpdate }

// String returns the one-letter Debezium name.
func (o Op) String() string { return string(rune(o)) }

// Partition names one Kafka topic-partition.
type Partition struct {
	Topic     string
	Partition int32
}

// String formats the partition as topic/partition.
func (p Partition) String() string { return fmt.Sprintf("%s/%d", p.Topic, p.Partition) }

// Origin is where an event came from in Kafka.
type Origin struct {
	Partition
	Offset int64
}

// TxnMark places an event in its source transaction: the transaction's
// id (as its END record names it, debezium.TransactionID), the data collection the
// event belongs to (as the END record's data_collections name it) and
// its total_order in the transaction (unique within it, from 1).
type TxnMark struct {
	// Topic is the transaction metadata topic its END is read from.
	Topic      string
	ID         string
	Collection string
	Order      int64
}

// Unavailable is Debezium's placeholder for a value it did not capture
// (an unchanged TOASTed column); it means "unchanged since the previous event".
const Unavailable = "__debezium_unavailable_value"

// Event is one change of one row, decoded and ready to be sequenced and applied.
//
// Key holds the business key values in the order of the table's key columns;
// After is the row image (nil for deletes and truncates). Values are the
// decoded JSON values: nil, bool, string, json.Number, float64, int64,
// time.Time, []byte, or nested map[string]any / []any for JSON columns.
type Event struct {
	Table    string // the configured target table this event belongs to
	Key      []any
	KeyNames []string // the key columns, when the table configures none
	// OldKey is the previous key of a create that Debezium emits for a
	// primary-key change (header __debezium.oldkey), in Key's order: its
	// unavailable-value placeholders take the old key's values.
	OldKey    []any
	Seq       Seq
	ValidFrom time.Time
	After     map[string]any
	// AfterJSON is the row image as a JSON object, kept instead of After by
	// the Kafka decoder to hold buffered events compactly; the sink decodes
	// it (numbers as json.Number). Set at most one of After and AfterJSON.
	// It is never written to once set: decoded string values share its
	// bytes (RowVisitor), so it must not come from a reused buffer.
	AfterJSON []byte
	// Row, when set, decodes AfterJSON into typed values and names the
	// source columns with their PostgreSQL types (events decoded with a
	// schema); without it AfterJSON is decoded as schemaless JSON.
	Row RowDecoder
	// AfterValues is the row image as typed values in the order of
	// Row.Columns(), kept instead of After by a decoder that decodes at
	// once (Avro): a slice, not a map per image. Set at most one of
	// After, AfterJSON and AfterValues.
	AfterValues []any
	Origin      Origin
	// Received is when the consumer fetched the event (unix nanoseconds;
	// 0 if unknown): a batch's age counts from its oldest event's.
	Received int64
	// Source names the connector's stream that wrote the event (Debezium's
	// source.name, its topic.prefix, and source.db: "name/db"; "" if the
	// envelope has no name).
	Source string
	// Txn is the event's place in its source transaction (Debezium's
	// transaction block), read only for a table with transaction_topic;
	// nil otherwise or when the event has none (a snapshot read).
	Txn *TxnMark

	keyID string
	// keyRoom holds a one-column Key in the event itself (KeyRoom); a
	// second column would take the struct to the next size class.
	keyRoom [1]any
	// afterPacked is AfterValues packed (PackAfterValues) while the event
	// waits in the buffer; AfterValues is then nil.
	afterPacked []byte
	hash        [16]byte

	// The one-byte fields, together: no padding between them.

	Op Op
	// KeyChanged marks the delete of a primary-key change (header
	// __debezium.newkey): the row lives on under another key.
	KeyChanged bool
	// AfterValid: AfterJSON was cut from a message the decoder validated
	// as JSON, and is not validated again.
	AfterValid bool
	// Complete says the image is the whole row: a column it lacks is null
	// in it, not unknown (a MongoDB document, whose fields come and go).
	// Without it a column missing from an image is absent (DESIGN.md
	// section 5): the version takes it from a later image that has it.
	Complete bool
	// TimeStandIn says ValidFrom is source.ts_ms standing in for a
	// valid_from column the event has no image of (a delete, with
	// valid_from: after.<column>): coarser, and from another clock, so it
	// takes no part in the sequence disagreements (sink.Result).
	TimeStandIn bool
	// SnapshotEnd marks the last read of a table's full snapshot
	// (source.snapshot last or last_in_data_collection; never an
	// incremental snapshot's): its Seq is the snapshot's sequence.
	SnapshotEnd bool
	hashd       bool
	// visitable caches jsonscan.Visitable(AfterJSON) for an image without a
	// schema: 0 unknown, 1 yes, -1 no.
	visitable int8
}

// PackAfterValues keeps AfterValues packed (AppendValues) until the row is
// visited: one byte slice instead of a boxed value per column while the
// event waits in the sequencer's buffer. It digests the event first (Hash),
// from the values, so call it once Op, ValidFrom and the image are final:
// the digest is not taken again. An image with a value of a type with no
// packed form stays as it is.
func (e *Event) PackAfterValues() {
	if e.AfterValues == nil {
		return
	}
	e.Hash()
	n := 2 + ValuesSize(e.AfterValues, 10)
	if b, ok := AppendValues(make([]byte, 0, n), e.AfterValues); ok {
		e.afterPacked, e.AfterValues = b, nil
	}
}

// afterValues returns AfterValues, unpacked from afterPacked if packed.
func (e *Event) afterValues(boxes *Boxes) ([]any, error) {
	if e.afterPacked == nil {
		return e.AfterValues, nil
	}
	u := NewUnpacker(e.afterPacked, boxes)
	vs := u.Values()
	return vs, u.Done()
}

// Size estimates the memory an event holds, in bytes: the struct, the raw
// row image, the sequence and the key. The sequencer bounds its buffer
// with it.
func (e *Event) Size() int {
	n := eventOverhead + len(e.AfterJSON) + len(e.Seq) + len(e.keyID) + len(e.Table)
	for _, v := range e.Key {
		n += 16
		if s, ok := v.(string); ok {
			n += len(s)
		}
	}
	if e.After != nil {
		n += 128 * len(e.After) // a decoded image: map slots and boxed values
	}
	return n + len(e.afterPacked) + ValuesSize(e.AfterValues, 40) // 40: a boxed value
}

// ValuesSize estimates the memory of values: per bytes for each, plus
// the text of strings, byte slices and JSON.
func ValuesSize(vs []any, per int) int {
	n := per * len(vs)
	for _, v := range vs {
		switch x := v.(type) {
		case string:
			n += len(x)
		case []byte:
			n += len(x)
		case json.RawMessage:
			n += len(x)
		}
	}
	return n
}

// eventOverhead is an Event's struct and the allocations around it: the
// struct itself, and the image's allocation rounded up to its size class
// (about 32 bytes on average; sequencer.TestBudgetCountsMemory checks the
// sum against the heap).
const eventOverhead = int(unsafe.Sizeof(Event{})) + 32

// KeyRoom returns n nil values for Key, held in the event itself when n
// is small: no allocation of their own.
func (e *Event) KeyRoom(n int) []any {
	if n <= len(e.keyRoom) {
		return e.keyRoom[:n:n]
	}
	return make([]any, n)
}

// SetKeyID records id, which must be KeyID(e.Key), as the key's identity:
// for a decoder that builds it into memory it allocates anyway.
func (e *Event) SetKeyID(id string) { e.keyID = id }

// KeyID returns a canonical string identifying the event's business key
// within its table; equal keys give equal strings.
func (e *Event) KeyID() string {
	if e.keyID == "" {
		e.keyID = KeyID(e.Key)
	}
	return e.keyID
}

// Hash returns a digest of the event's content (operation, valid-from time and
// after image); two deliveries of the same change have the same hash.
func (e *Event) Hash() [16]byte {
	if !e.hashd {
		vals, _ := e.afterValues(nil) // PackAfterValues digests before it packs
		switch {
		case e.After == nil && vals != nil && e.Row != nil && len(e.Row.Columns()) == len(vals):
			// The digest of the same image as a map: what the table
			// holds for events decoded into maps (scd_hash) stays equal.
			e.hash = contentHashValues(e.Op, e.ValidFrom, e.Row.Columns(), vals)
		case e.After == nil && e.AfterJSON != nil:
			e.hash = RawContentHash(e.Op, e.ValidFrom, e.AfterJSON)
		default:
			e.hash = ContentHash(e.Op, e.ValidFrom, e.After)
		}
		e.hashd = true
	}
	return e.hash
}

// SetHash gives the event the digest h instead of one taken from its
// content: an event read back from a history table (a carried version,
// package carry) keeps the digest of the event that wrote it (scd_hash),
// so that the original, delivered again, is a duplicate of it. A digest
// of another length is ignored.
func (e *Event) SetHash(h []byte) {
	if len(h) == len(e.hash) {
		copy(e.hash[:], h)
		e.hashd = true
	}
}

// Column is a source column as an event's schema declares it.
type Column struct {
	Name string
	// PGType is the PostgreSQL type the column maps to (DESIGN.md section 4).
	PGType string
}

// RowDecoder turns raw row images into typed values. One RowDecoder serves
// every event written with the same schema; it is immutable and safe for
// concurrent use.
type RowDecoder interface {
	// Columns are the source columns in the schema's order.
	Columns() []Column
	// DecodeRow decodes a raw row image. Values are nil, bool, int16, int32,
	// int64, float32, float64, string, []byte, json.RawMessage (JSON text,
	// kept exactly), time.Time, pgtype.Numeric, pgtype.Time,
	// pgtype.Interval, pgtype.Timestamp and pgtype.Timestamptz (infinities),
	// or []any of those for arrays; Unavailable marks Debezium's
	// unavailable-value placeholder in a column of any type.
	DecodeRow(raw []byte) (map[string]any, error)
}

// RowVisitor is a RowDecoder that can also hand a row image's columns
// over one by one, in the image's order, without building a map. It stops
// at fn's first error and returns it as it is. valid says that raw is
// known to be valid JSON (the decoder validated it): it is not checked
// again.
type RowVisitor interface {
	VisitRow(raw []byte, valid bool, boxes *Boxes, fn func(name string, v any) error) error
}

// CanVisitAfter reports whether VisitAfter can hand the row image over
// without a map: AfterValues, or AfterJSON with a RowVisitor.
func (e *Event) CanVisitAfter() bool {
	if e.After != nil {
		return false
	}
	if e.Row == nil {
		if e.AfterJSON == nil || e.AfterValues != nil || e.afterPacked != nil {
			return false
		}
		if e.visitable == 0 {
			e.visitable = -1
			if jsonscan.Visitable(e.AfterJSON) && (e.AfterValid || gjson.Valid(unsafe.String(unsafe.SliceData(e.AfterJSON), len(e.AfterJSON)))) {
				e.visitable = 1 // valid JSON: VisitAfterNames reads it as it is
			}
		}
		return e.visitable > 0
	}
	if e.AfterValues != nil || e.afterPacked != nil {
		return true
	}
	_, ok := e.Row.(RowVisitor)
	return ok && e.AfterJSON != nil
}

// VisitAfter hands the row image's columns to fn one by one (see
// CanVisitAfter), stopping at fn's first error. Values decoded here are
// boxed from boxes (nil: the ordinary way).
func (e *Event) VisitAfter(boxes *Boxes, fn func(name string, v any) error) error {
	if e.AfterValues != nil || e.afterPacked != nil {
		vals, err := e.afterValues(boxes)
		if err != nil {
			return fmt.Errorf("row image: %w", err)
		}
		cols := e.Row.Columns()
		if len(cols) != len(vals) {
			return fmt.Errorf("row image has %d values for %d columns", len(vals), len(cols))
		}
		for i, c := range cols {
			if err := fn(c.Name, vals[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if e.Row == nil {
		return jsonscan.Visit(e.AfterJSON, e.AfterValid, boxes, fn)
	}
	return e.Row.(RowVisitor).VisitRow(e.AfterJSON, e.AfterValid, boxes, fn)
}

// VisitAfterNames hands the names of a schemaless image's columns to fn
// until it returns false (an event CanVisitAfter, without a Row).
func (e *Event) VisitAfterNames(fn func(name string) bool) {
	if e.Row == nil && e.CanVisitAfter() {
		jsonscan.VisitNames(e.AfterJSON, fn)
	}
}

// DecodeAfter returns the event's row image, decoding AfterJSON if needed.
func (e *Event) DecodeAfter() (map[string]any, error) {
	if e.After == nil && (e.AfterValues != nil || e.afterPacked != nil) && e.Row != nil {
		m := make(map[string]any, len(e.Row.Columns()))
		err := e.VisitAfter(nil, func(name string, v any) error {
			m[name] = v
			return nil
		})
		return m, err
	}
	if e.After != nil || e.AfterJSON == nil {
		return e.After, nil
	}
	if e.Row != nil {
		return e.Row.DecodeRow(e.AfterJSON)
	}
	return jsonscan.DecodeObject(e.AfterJSON)
}
