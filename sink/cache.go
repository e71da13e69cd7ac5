package sink

import (
	"encoding/json"
	"strings"
	"unsafe"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
)

// stateCache remembers, per table and key, what the append path last wrote
// (the latest version and the side-table summary), so the next batch of the
// key need not read it back. It is bounded by keys and by estimated bytes:
// two generations of at most half of each; a key read from the older
// generation moves to the newer one, and when the newer one is full the
// older one is dropped.
//
// The cache is only right while this Sink is the only writer of its keys:
// Apply empties it whenever scd2sink_offsets shows that another writer
// applied one of the batch's partitions since this Sink last did, Forget
// empties it on rebalances, and entries change only after a commit.
type stateCache struct {
	limit, maxBytes     int
	cur, prev           map[cacheKey]cacheEntry
	curBytes, prevBytes int
}

// cacheEntry is a key's state, packed (cachepack.go) or, when a value has
// no packed form, as it is.
type cacheEntry struct {
	blob []byte
	l    *fold.Latest
	size int // estimated bytes
	// key is the entry's own copy of its key's identity, which the map
	// keeps: a batch's identities share its memory (tablePlan.intern),
	// and a map assignment stores the key it is given, even over an
	// existing entry.
	key string
}

// state returns the entry's state: a fresh one for a packed entry; the
// kept one, which its users never change, for another. A packed entry
// that does not unpack (it cannot happen: it is pack's own output) is a
// miss, and the key is read from the table.
func (e cacheEntry) state(boxes *change.Boxes, mem *fold.Mem) (*fold.Latest, bool) {
	if e.l != nil {
		return e.l, true
	}
	l, err := unpackLatest(e.blob, boxes, mem)
	return l, err == nil
}

// cacheKey names a key of one table as the sink knows it: when a column is
// added the table is read anew, and the entries of the old one miss.
type cacheKey struct {
	table *table
	key   string
}

func newStateCache(limit, maxBytes int) *stateCache {
	c := &stateCache{limit: limit, maxBytes: maxBytes}
	c.reset()
	return c
}

func (c *stateCache) reset() {
	c.cur, c.prev = map[cacheKey]cacheEntry{}, map[cacheKey]cacheEntry{}
	c.curBytes, c.prevBytes = 0, 0
}

func (c *stateCache) get(k cacheKey) (*fold.Latest, bool) {
	e, ok := c.entry(k)
	if !ok {
		return nil, false
	}
	return e.state(nil, nil)
}

// entry returns a key's entry, moving it to the newer generation; its
// state is unpacked by the caller, outside any lock.
func (c *stateCache) entry(k cacheKey) (cacheEntry, bool) {
	e, ok := c.cur[k]
	if !ok {
		if e, ok = c.prev[k]; !ok {
			return e, false
		}
		delete(c.prev, k)
		c.prevBytes -= e.size
		c.store(k, e)
	}
	return e, true
}

func (c *stateCache) put(k cacheKey, l *fold.Latest) {
	if c.limit <= 0 {
		return
	}
	e, _ := newEntry(nil, k, l)
	c.store(k, e)
}

// newEntry packs l, if it can, by way of scratch, which it returns for
// the next one.
func newEntry(scratch []byte, k cacheKey, l *fold.Latest) (cacheEntry, []byte) {
	if b, ok := packLatest(scratch[:0], l); ok {
		// The key's own copy and the blob share one allocation: one
		// object fewer for the collector per cached key.
		mem := append(append(make([]byte, 0, len(k.key)+len(b)), k.key...), b...)
		blob := mem[len(k.key):len(mem):len(mem)]
		return cacheEntry{blob: blob, key: unsafe.String(unsafe.SliceData(mem), len(k.key)), size: 96 + len(k.key) + len(blob)}, b
	}
	return cacheEntry{l: detach(l), size: estimate(l, k)}, scratch
}

func (c *stateCache) store(k cacheKey, e cacheEntry) {
	old, ok := c.cur[k]
	switch {
	case e.key != "": // its own copy (a packed entry, or one moved from the older generation)
		k.key = e.key
	case ok && old.blob == nil: // not in a packed entry's memory, which would stay alive
		k.key = old.key
	default:
		k.key = strings.Clone(k.key)
	}
	e.key = k.key
	if ok {
		c.curBytes -= old.size
	} else if len(c.cur) >= c.limit/2 || (c.maxBytes > 0 && c.curBytes+e.size > c.maxBytes/2) {
		c.prev, c.cur = c.cur, make(map[cacheKey]cacheEntry, len(c.cur)) // sized as the last one: no growth while it fills
		c.prevBytes, c.curBytes = c.curBytes, 0
	}
	if old, ok := c.prev[k]; ok { // a newer state replaces the older generation's
		delete(c.prev, k)
		c.prevBytes -= old.size
	}
	c.cur[k] = e
	c.curBytes += e.size
}

func (c *stateCache) drop(k cacheKey) {
	if e, ok := c.cur[k]; ok {
		delete(c.cur, k)
		c.curBytes -= e.size
	}
	if e, ok := c.prev[k]; ok {
		delete(c.prev, k)
		c.prevBytes -= e.size
	}
}

// estimate is the memory an entry holds, in bytes (roughly: the version,
// its key and row values).
func estimate(l *fold.Latest, k cacheKey) int {
	n := 160 + len(k.key) + len(l.SideMaxSeq)
	if v := l.V; v != nil {
		n += 200 + len(v.Seq) + len(v.CloseSeq) + len(v.Hash) + valuesSize(v.Key) + valuesSize(v.Row) + valuesSize(v.Opener)
	}
	return n
}

// valuesSize estimates the memory of typed values.
func valuesSize(vs []any) int {
	n := 16 * len(vs)
	for _, v := range vs {
		switch x := v.(type) {
		case string:
			n += 16 + len(x)
		case []byte:
			n += 24 + len(x)
		case json.RawMessage:
			n += 24 + len(x)
		case nil, bool:
		default:
			n += 32
		}
	}
	return n
}

// cacheOps are the changes one transaction makes to the cache, applied only
// once it has committed. States are packed as they are set, while the fold
// has just touched them, not after the commit.
type cacheOps struct {
	put  []cachePut // in order: a later one for the same key wins
	drop []cacheKey
	// reset: forget every key (a truncate folded too many to drop).
	reset   bool
	scratch []byte // where states are packed before their exact copy
	// mem holds the values and structs of the states unpacked for the
	// transaction.
	mem fold.Mem
	// off: nothing set is kept (no cache, or a batch applied isolating
	// values, after which the cache is emptied).
	off bool
	// pre is what the transaction read ahead for its tables (prefetch.go).
	pre *prefetched
}

type cachePut struct {
	k cacheKey
	e cacheEntry
}

// set records l as k's state once the transaction commits. l is packed, or
// detached, before set returns: it may share rows with the batch.
func (o *cacheOps) set(k cacheKey, l *fold.Latest) {
	if o.off {
		return
	}
	var e cacheEntry
	e, o.scratch = newEntry(o.scratch, k, l)
	o.put = append(o.put, cachePut{k, e})
}

func (c *stateCache) apply(o *cacheOps) {
	if o.reset {
		c.reset()
		return
	}
	for _, k := range o.drop {
		c.drop(k)
	}
	if c.limit <= 0 {
		return
	}
	for _, p := range o.put {
		c.store(p.k, p.e)
	}
}
