package sink

// stateCache remembers, per table and key, what the append path last wrote
// (the latest version and the side-table summary), so the next batch of the
// key need not read it back. It is bounded: two generations of at most
// limit/2 keys each; a key read from the older generation moves to the
// newer one, and when the newer one is full the older one is dropped.
//
// The cache is only right while this Sink is the only writer of its keys:
// Apply empties it whenever scd2sink_offsets shows that another writer
// applied one of the batch's partitions since this Sink last did, Forget
// empties it on rebalances, and entries change only after a commit.
type stateCache struct {
	limit     int
	cur, prev map[cacheKey]*latest
}

// cacheKey names a key of one table as the sink knows it: when a column is
// added the table is read anew, and the entries of the old one miss.
type cacheKey struct {
	table *table
	key   string
}

func newStateCache(limit int) *stateCache {
	c := &stateCache{limit: limit}
	c.reset()
	return c
}

func (c *stateCache) reset() {
	c.cur, c.prev = map[cacheKey]*latest{}, map[cacheKey]*latest{}
}

func (c *stateCache) get(k cacheKey) (*latest, bool) {
	if l, ok := c.cur[k]; ok {
		return l, true
	}
	if l, ok := c.prev[k]; ok {
		c.put(k, l)
		delete(c.prev, k)
		return l, true
	}
	return nil, false
}

func (c *stateCache) put(k cacheKey, l *latest) {
	if c.limit <= 0 {
		return
	}
	if _, ok := c.cur[k]; !ok && len(c.cur) >= c.limit/2 {
		c.prev, c.cur = c.cur, map[cacheKey]*latest{}
	}
	c.cur[k] = l
}

func (c *stateCache) drop(k cacheKey) {
	delete(c.cur, k)
	delete(c.prev, k)
}

// cacheOps are the changes one transaction makes to the cache, applied only
// once it has committed.
type cacheOps struct {
	put  map[cacheKey]*latest
	drop []cacheKey
}

func (o *cacheOps) set(k cacheKey, l *latest) {
	if o.put == nil {
		o.put = map[cacheKey]*latest{}
	}
	o.put[k] = l
}

func (c *stateCache) apply(o *cacheOps) {
	for _, k := range o.drop {
		c.drop(k)
	}
	for k, l := range o.put {
		c.put(k, l)
	}
}
