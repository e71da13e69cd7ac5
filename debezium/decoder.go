package debezium

import (
	"errors"
	"fmt"
	"strings"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Rule says how to decode one topic (one `tables` entry of the config).
type Rule struct {
	Topic      string
	Target     string
	Keys       []string // empty: the fields of the Kafka message key
	SequenceBy []string // envelope paths, "payload." implied
	ValidFrom  string   // envelope path
	Format     string   // debezium-json (default) | debezium-avro
}

// rule is a Rule with its paths split.
type rule struct {
	Rule
	seqPaths [][]string
	vfPath   []string
}

// ErrSkip marks a record that needs no apply: a tombstone or a heartbeat.
var ErrSkip = errors.New("nothing to apply")

// Decoder turns Debezium records into change events, one topic's format
// each. Decode may be called from several goroutines at once.
type Decoder struct {
	rules   map[string]*rule
	schemas *schemaCache
}

// maxSchemas bounds the schema cache: distinct schema texts (value and key
// schemas of every topic, and their versions as the sources evolve).
const maxSchemas = 1024

// New returns a Decoder for the given rules.
func New(rules []Rule) *Decoder {
	d := &Decoder{rules: map[string]*rule{}, schemas: newSchemaCache(maxSchemas)}
	for _, r := range rules {
		cr := &rule{Rule: r, vfPath: splitPath(r.ValidFrom)}
		for _, p := range r.SequenceBy {
			cr.seqPaths = append(cr.seqPaths, splitPath(p))
		}
		d.rules[r.Topic] = cr
	}
	return d
}

// splitPath splits an envelope path; a leading "payload." is implied.
func splitPath(p string) []string {
	return strings.Split(strings.TrimPrefix(p, "payload."), ".")
}

// Target returns the target table configured for topic, "" if none.
func (d *Decoder) Target(topic string) string {
	if r := d.rules[topic]; r != nil {
		return r.Target
	}
	return ""
}

// Decode decodes one record. It returns ErrSkip for tombstones and
// heartbeats, and another error, naming what is wrong, for anything that
// must go to the dead-letter table. The event keeps no reference to key or
// value.
func (d *Decoder) Decode(o change.Origin, key, value []byte) (*change.Event, error) {
	r := d.rules[o.Topic]
	if r == nil {
		return nil, fmt.Errorf("no table is configured for topic %q", o.Topic)
	}
	return d.decodeJSON(r, o, key, value)
}
