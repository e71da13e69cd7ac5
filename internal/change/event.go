// Package change defines the change event that flows through scd2sink's
// stages: the consumer builds it from a Kafka record, the sequencer orders it
// per key, and the sink folds it into a history table.
package change

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strings"
	"time"
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
	Table     string // the configured target table this event belongs to
	Key       []any
	Seq       Seq
	Op        Op
	ValidFrom time.Time
	After     map[string]any
	Origin    Origin

	keyID string
	hash  [16]byte
	hashd bool
}

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
		e.hash = ContentHash(e.Op, e.ValidFrom, e.After)
		e.hashd = true
	}
	return e.hash
}

// KeyID canonically encodes key values.
func KeyID(key []any) string {
	var b strings.Builder
	for i, v := range key {
		if i > 0 {
			b.WriteByte(0)
		}
		writeCanon(&b, v)
	}
	return b.String()
}

// ContentHash digests an event's content. Values are encoded with a type tag,
// so NULL, "" and 0 differ, and map keys are sorted.
func ContentHash(op Op, validFrom time.Time, after map[string]any) [16]byte {
	var b strings.Builder
	b.WriteByte(byte(op))
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], uint64(validFrom.UnixNano()))
	b.Write(ts[:])
	if after != nil {
		writeCanon(&b, after)
	}
	sum := sha256.Sum256([]byte(b.String()))
	var out [16]byte
	copy(out[:], sum[:16])
	return out
}

// Canon returns the canonical encoding of one value: a type tag followed by
// an unambiguous rendering. It is what "compares values exactly" means.
func Canon(v any) string {
	var b strings.Builder
	writeCanon(&b, v)
	return b.String()
}

func writeCanon(b *strings.Builder, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteString("N")
	case bool:
		if x {
			b.WriteString("B1")
		} else {
			b.WriteString("B0")
		}
	case string:
		writeLen(b, 'S', x)
	case json.Number:
		writeNumber(b, string(x))
	case int:
		writeNumber(b, fmt.Sprint(x))
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		writeNumber(b, fmt.Sprint(x))
	case float32:
		writeFloat(b, float64(x))
	case float64:
		writeFloat(b, x)
	case time.Time:
		writeLen(b, 'T', x.UTC().Format(time.RFC3339Nano))
	case []byte:
		writeLen(b, 'X', string(x))
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(b, "M%d{", len(keys))
		for _, k := range keys {
			writeLen(b, 'S', k)
			writeCanon(b, x[k])
		}
		b.WriteByte('}')
	case []any:
		fmt.Fprintf(b, "A%d[", len(x))
		for _, e := range x {
			writeCanon(b, e)
		}
		b.WriteByte(']')
	case fmt.Stringer:
		writeLen(b, 'O', x.String())
	default:
		raw, err := json.Marshal(x)
		if err != nil {
			raw = []byte(fmt.Sprintf("%#v", x))
		}
		writeLen(b, 'J', string(raw))
	}
}

func writeLen(b *strings.Builder, tag byte, s string) {
	b.WriteByte(tag)
	fmt.Fprintf(b, "%d:", len(s))
	b.WriteString(s)
}

// writeNumber renders integers and decimals so that 1, 1.0 and 1e0 are equal.
func writeNumber(b *strings.Builder, s string) {
	if r, ok := new(big.Rat).SetString(s); ok {
		writeLen(b, 'D', r.RatString())
		return
	}
	writeLen(b, 'S', s)
}

func writeFloat(b *strings.Builder, f float64) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		writeLen(b, 'F', fmt.Sprint(f))
		return
	}
	r := new(big.Rat)
	r.SetFloat64(f)
	writeLen(b, 'D', r.RatString())
}
