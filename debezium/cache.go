package debezium

import (
	"hash/maphash"
	"sync"
)

// schemaCache remembers parsed schemas by their exact bytes. The
// JsonConverter repeats a topic's schema, byte for byte, in every message:
// parsing (and validating) it once per distinct text is what makes decoding
// cheap. A hit compares the whole text, so a hash collision can never hand
// out the wrong schema. It is bounded: when full it starts again empty.
type schemaCache struct {
	mu   sync.Mutex
	seed maphash.Seed
	m    map[uint64][]*cached
	n    int
	max  int
}

// cached is one parsed schema text. Exactly one of the fields is set.
type cached struct {
	raw string
	env *envelopeSchema
	row *rowSchema // a key schema
	err error
}

func newSchemaCache(max int) *schemaCache {
	return &schemaCache{seed: maphash.MakeSeed(), m: map[uint64][]*cached{}, max: max}
}

// get returns the entry for raw, building it with parse on a miss. raw may
// alias a Kafka record's buffer: the entry keeps a copy.
func (c *schemaCache) get(raw string, parse func(string) *cached) *cached {
	h := maphash.String(c.seed, raw)
	c.mu.Lock()
	for _, e := range c.m[h] {
		if e.raw == raw {
			c.mu.Unlock()
			return e
		}
	}
	c.mu.Unlock()
	own := string([]byte(raw))
	e := parse(own)
	e.raw = own
	c.mu.Lock()
	if c.n >= c.max {
		c.m, c.n = map[uint64][]*cached{}, 0
	}
	c.m[h] = append(c.m[h], e)
	c.n++
	c.mu.Unlock()
	return e
}
