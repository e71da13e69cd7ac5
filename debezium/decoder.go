package debezium

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/twmb/franz-go/pkg/sr"
	"go.uber.org/zap"
)

// Rule says how to decode one topic (one `tables` entry of the config).
type Rule struct {
	Topic      string
	Target     string
	Keys       []string // empty: the fields of the Kafka message key
	SequenceBy []string // envelope paths, "payload." implied
	ValidFrom  string   // envelope path
	Format     string   // debezium-json (default) | debezium-avro
	// Connector is the source connector (config's connector); "mongodb"
	// reads flattened records as documents (flat.go).
	Connector string
	// TransactionTopic, when set, is the topic of the connector's
	// transaction metadata: each event's transaction block is read into
	// Event.Txn (txmeta.go).
	TransactionTopic string
}

// rule is a Rule with its paths split.
type rule struct {
	Rule
	seqPaths [][]string
	gtid     []bool // seqPaths[i] is read as a GTID (gtid.go)
	streams  streams
	docs     docSchemas // the topic's MongoDB documents' row schemas (mongo.go)
	vfPath   []string
	// images: a path reads the before or after image itself, so Avro
	// envelopes are decoded whole (avroplan.go reads neither into the
	// record map).
	images bool
	// The schemas of the topic's last message (value and key): the
	// JsonConverter repeats them, so a message is first tried against them.
	lastValue, lastKey, lastHeader atomic.Pointer[cached]
	// source is the connector that writes the topic (source.name and
	// source.db, read from its first event that has a name): every event
	// shares the string.
	source atomic.Pointer[string]
	// noTxn warns once of a streamed event without a transaction block
	// on a topic with a transaction topic (txmeta.go).
	noTxn sync.Once
	// coll is the last data collection its events named (txmeta.go).
	coll atomic.Pointer[collKey]
}

// sourceName and sourceDB are the envelope paths of the connector's
// logical name and of the database the event comes from.
var (
	sourceName = []string{"source", "name"}
	sourceDB   = []string{"source", "db"}
)

// sourceKey names the stream a connector writes an event in: its name,
// and the database when there is one (a connector capturing several
// databases, as SQL Server's may with a task each, writes a stream per
// database, and one may stall while another goes on).
func sourceKey(name, db string) string {
	if name == "" || db == "" {
		return name
	}
	return name + "/" + db
}

// connector returns the topic's connector name, remembering name (read
// by lookup only while none is known).
func (r *rule) connector(lookup func() string) string {
	if p := r.source.Load(); p != nil {
		return *p
	}
	name := strings.Clone(lookup())
	if name != "" {
		r.source.Store(&name)
	}
	return name
}

// ErrSkip marks a record that needs no apply: a tombstone or a heartbeat.
var ErrSkip = errors.New("nothing to apply")

// ErrRetry marks a record that could not be decoded yet: the schema
// registry was unreachable until the caller's context ended. It is not a
// dead letter; the record must be read again.
var ErrRetry = errors.New("waiting for the schema registry")

// Registry fetches writer schemas by id: franz-go's *sr.Client, or srfake's
// client in tests. It is called only on a cache miss.
type Registry interface {
	SchemaByID(ctx context.Context, id int) (sr.Schema, error)
}

// Decoder turns Debezium records into change events, one topic's format
// each. Decode may be called from several goroutines at once.
type Decoder struct {
	// rules are the known topics' rules, replaced whole (copy on write)
	// when resolve adds one: lookups take no lock.
	rules   atomic.Pointer[map[string]*rule]
	mu      sync.Mutex // serialises additions
	resolve func(topic string) (Rule, bool)
	schemas *schemaCache
	avro    *avroCache
	wire    WireIDs
	// streamHook hears of a topic's first event in a GTID stream other
	// than those it saw before (SetStreamHook).
	streamHook func(topic, stream, other string)
	log        *zap.Logger
}

// SetStreamHook sets f to be called, from Decode, the first time an event
// of a topic carries a GTID of a stream (a MariaDB domain, a MySQL source
// uuid) other than the streams the topic's events carried before: such
// events do not order against each other by their GTIDs. Call it before
// the first Decode.
func (d *Decoder) SetStreamHook(f func(topic, stream, other string)) { d.streamHook = f }

// gtidPart appends a GTID sequence component and notes its stream; a
// value that is no GTID is an error (the event cannot be ordered).
func (d *Decoder) gtidPart(r *rule, seq []byte, s string) ([]byte, error) {
	seq, stream, ok := appendGTID(seq, s)
	if !ok {
		return nil, fmt.Errorf("is %q, not a GTID (MariaDB's domain-server-seq or MySQL's uuid:N, numbers below 2^63)", clip(s))
	}
	if other, isNew := r.streams.note(stream); isNew && d.streamHook != nil {
		d.streamHook(r.Topic, stream, other)
	}
	return seq, nil
}

// maxSchemas bounds the schema cache: distinct schema texts (value and key
// schemas of every topic, and their versions as the sources evolve).
const maxSchemas = 1024

// New returns a Decoder for the given rules. reg is needed only by rules of
// format debezium-avro (nil otherwise); log (nil: none) hears about an
// unreachable registry.
func New(rules []Rule, reg Registry, log *zap.Logger) *Decoder {
	if log == nil {
		log = zap.NewNop()
	}
	d := &Decoder{schemas: newSchemaCache(maxSchemas), avro: newAvroCache(reg, log), log: log}
	m := map[string]*rule{}
	for _, r := range rules {
		m[r.Topic] = newRule(r)
	}
	d.rules.Store(&m)
	return d
}

func newRule(r Rule) *rule {
	cr := &rule{Rule: r, vfPath: splitPath(r.ValidFrom)}
	for _, p := range r.SequenceBy {
		sp := splitPath(p)
		cr.seqPaths = append(cr.seqPaths, sp)
		cr.gtid = append(cr.gtid, isGTIDPath(sp))
	}
	for _, p := range append([][]string{cr.vfPath}, cr.seqPaths...) {
		cr.images = cr.images || (len(p) > 0 && (p[0] == "before" || p[0] == "after"))
	}
	return cr
}

// SetResolver gives the rule of a topic the Decoder was not made with
// (topic patterns): asked once per topic, its answer kept when ok. Call it
// before the first Decode.
func (d *Decoder) SetResolver(f func(topic string) (Rule, bool)) { d.resolve = f }

// rule returns topic's rule, nil when none.
func (d *Decoder) rule(topic string) *rule {
	if r := (*d.rules.Load())[topic]; r != nil || d.resolve == nil {
		return r
	}
	nr, ok := d.resolve(topic)
	if !ok {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.rules.Load()
	if r := old[topic]; r != nil {
		return r
	}
	m := make(map[string]*rule, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	r := newRule(nr)
	m[topic] = r
	d.rules.Store(&m)
	return r
}

// SetLookupTimeout sets how long an Avro schema id the registry does not
// know (40403) is asked for again before its records are dead letters
// (schema_registry.lookup_timeout; default DefaultLookupTimeout).
func (d *Decoder) SetLookupTimeout(t time.Duration) { d.avro.lookupTimeout = t }

// splitPath splits an envelope path; a leading "payload." is implied.
func splitPath(p string) []string {
	return strings.Split(strings.TrimPrefix(p, "payload."), ".")
}

// ruleList returns the rules the Decoder was made with.
func (d *Decoder) ruleList() []Rule {
	var out []Rule
	for _, r := range *d.rules.Load() {
		out = append(out, r.Rule)
	}
	return out
}

// Target returns the target table configured for topic, "" if none.
func (d *Decoder) Target(topic string) string {
	if r := d.rule(topic); r != nil {
		return r.Target
	}
	return ""
}

// TransactionTopic returns the transaction metadata topic of topic's
// table ("" none).
func (d *Decoder) TransactionTopic(topic string) string {
	if r := d.rule(topic); r != nil {
		return r.TransactionTopic
	}
	return ""
}

// Decode decodes one record. It returns ErrSkip for tombstones and
// heartbeats, and another error, naming what is wrong, for anything that
// must go to the dead-letter table. The event keeps no reference to key or
// value.
// sourceSnapshot is the envelope path of Debezium's snapshot marker.
var sourceSnapshot = []string{"source", "snapshot"}

// snapshotEnd reports whether a source.snapshot marker ends a table's full
// snapshot ("last" ends the whole snapshot, "last_in_data_collection" one
// table's part of it; "incremental" never counts).
func snapshotEnd(marker string) bool {
	return marker == "last" || marker == "last_in_data_collection"
}

// A snapshot read (op r) without a sequence, as incremental snapshots
// write them, comes back with a nil Seq: the caller anchors it in its
// partition (see consumer).
//
// Avro schemas missing from the cache are fetched from the registry,
// retrying while it is unreachable; when ctx ends first Decode returns an
// error wrapping ErrRetry.
//
// headers are the record's headers: a create carrying __debezium.oldkey
// (Debezium's primary-key change) gets the old key in Event.OldKey.
func (d *Decoder) Decode(ctx context.Context, o change.Origin, key, value []byte, headers ...Header) (*change.Event, error) {
	r := d.rule(o.Topic)
	if r == nil {
		return nil, fmt.Errorf("no table is configured for topic %q", o.Topic)
	}
	var ev *change.Event
	var err error
	if r.Format == FormatAvro {
		ev, err = d.decodeAvro(ctx, r, o, key, value, headers)
	} else {
		ev, err = d.decodeJSON(r, o, key, value)
	}
	if err != nil {
		return ev, err
	}
	for _, h := range headers {
		if h.Key == NewKeyHeader && ev.Op == change.OpDelete {
			ev.KeyChanged = true
		}
		if h.Key == OldKeyHeader && ev.Op == change.OpCreate {
			if ev.OldKey, err = d.oldKey(ev, h.Value); err != nil {
				return nil, fmt.Errorf("header %s: %w", OldKeyHeader, err)
			}
		}
	}
	return ev, nil
}

// Header is a Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// OldKeyHeader is the header Debezium sets on the create of a primary-key
// change: the row's previous key (as JSON, the default header converter's
// form of a struct).
const OldKeyHeader = "__debezium.oldkey"

// NewKeyHeader is the header Debezium sets on the delete of a primary-key
// change: the row's new key.
const NewKeyHeader = "__debezium.newkey"

// DecodeKey reads a record's message key as Decode reads it for an event:
// its fields in order, typed by the key's schema (JSON with a schema, or
// Avro through the registry), and their names. Erasure reads the keys of
// records that could not be decoded, and of the key-change headers, with
// it (a header's value is the key as JSON).
func (d *Decoder) DecodeKey(ctx context.Context, topic string, key []byte, headers []Header) ([]any, []string, error) {
	r := d.rule(topic)
	if r == nil {
		r = &rule{}
	}
	if len(key) > 0 && key[0] != '{' && key[0] != '[' {
		if ks, krec, _, isAvro, err := d.decodeRecord(ctx, key, headers, true, true); isAvro {
			if err != nil {
				return nil, nil, err
			}
			if ks.row == nil {
				return nil, nil, errors.New("key is not an Avro record")
			}
			vals := make([]any, 0, len(ks.row.cols))
			for _, c := range ks.row.cols {
				v, err := c.native(krec[c.name])
				if err != nil {
					return nil, nil, fmt.Errorf("message key: column %s: %w", c.name, err)
				}
				vals = append(vals, v)
			}
			return vals, ks.row.names, nil
		}
	}
	fields, ks, err := d.keyFields(nil, key, &r.lastKey)
	if err != nil {
		return nil, nil, err
	}
	vals, names := make([]any, len(fields)), make([]string, len(fields))
	for i, f := range fields {
		v, err := typed(ks, f.name, f.v)
		if err != nil {
			return nil, nil, fmt.Errorf("message key: %w", err)
		}
		vals[i], names[i] = v, strings.Clone(f.name)
	}
	return vals, names, nil
}

// oldKey decodes the old key in the order of ev.Key.
func (d *Decoder) oldKey(ev *change.Event, raw []byte) ([]any, error) {
	fields, ks, err := d.keyFields(nil, raw, &d.rule(ev.Origin.Topic).lastHeader)
	if err != nil {
		return nil, err
	}
	names := ev.KeyNames
	if r := d.rule(ev.Origin.Topic); r != nil && len(r.Keys) > 0 {
		names = r.Keys
	}
	out := make([]any, len(names))
	for i, n := range names {
		found := false
		for _, f := range fields {
			if f.name == n {
				if out[i], err = typed(ks, n, f.v); err != nil {
					return nil, err
				}
				found = true
			}
		}
		if !found || out[i] == nil {
			return nil, fmt.Errorf("old key has no %s", n)
		}
	}
	return out, nil
}

// The formats of DESIGN.md section 3.
const (
	FormatJSON = "debezium-json"
	FormatAvro = "debezium-avro"
)
