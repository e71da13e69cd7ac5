package sink

import "encoding/json"

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
	cur, prev           map[cacheKey]*latest
	curBytes, prevBytes int
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
	c.cur, c.prev = map[cacheKey]*latest{}, map[cacheKey]*latest{}
	c.curBytes, c.prevBytes = 0, 0
}

func (c *stateCache) get(k cacheKey) (*latest, bool) {
	if l, ok := c.cur[k]; ok {
		return l, true
	}
	if l, ok := c.prev[k]; ok {
		delete(c.prev, k)
		c.prevBytes -= l.size
		c.put(k, l)
		return l, true
	}
	return nil, false
}

func (c *stateCache) put(k cacheKey, l *latest) {
	if c.limit <= 0 {
		return
	}
	l.size = l.estimate(k)
	old, ok := c.cur[k]
	if ok {
		c.curBytes -= old.size
	} else if len(c.cur) >= c.limit/2 || (c.maxBytes > 0 && c.curBytes+l.size > c.maxBytes/2) {
		c.prev, c.cur = c.cur, map[cacheKey]*latest{}
		c.prevBytes, c.curBytes = c.curBytes, 0
	}
	if old, ok := c.prev[k]; ok { // a newer state replaces the older generation's
		delete(c.prev, k)
		c.prevBytes -= old.size
	}
	c.cur[k] = l
	c.curBytes += l.size
}

func (c *stateCache) drop(k cacheKey) {
	if l, ok := c.cur[k]; ok {
		delete(c.cur, k)
		c.curBytes -= l.size
	}
	if l, ok := c.prev[k]; ok {
		delete(c.prev, k)
		c.prevBytes -= l.size
	}
}

// estimate is the memory an entry holds, in bytes (roughly: the version,
// its key and row values).
func (l *latest) estimate(k cacheKey) int {
	n := 160 + len(k.key) + len(l.sideMaxSeq)
	if v := l.v; v != nil {
		n += 200 + len(v.seq) + len(v.closeSeq) + len(v.hash) + valuesSize(v.key) + valuesSize(v.row) + valuesSize(v.opener)
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
// once it has committed.
type cacheOps struct {
	put  map[cacheKey]*latest
	drop []cacheKey
	// reset: forget every key (a truncate folded too many to drop).
	reset bool
}

func (o *cacheOps) set(k cacheKey, l *latest) {
	if o.put == nil {
		o.put = map[cacheKey]*latest{}
	}
	o.put[k] = l
}

func (c *stateCache) apply(o *cacheOps) {
	if o.reset {
		c.reset()
		return
	}
	for _, k := range o.drop {
		c.drop(k)
	}
	for k, l := range o.put {
		c.put(k, l)
	}
}
