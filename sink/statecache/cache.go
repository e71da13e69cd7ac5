package statecache

import (
	"encoding/json"
	"strings"
	"unsafe"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
)

// Cache remembers, per table and key, what the append path last wrote
// (the latest version and the side-table summary), so the next batch of the
// key need not read it back. It is bounded by keys and by estimated bytes;
// when full, it makes room by forgetting keys picked at random (from a
// random place in the map's iteration order: near uniform, not exactly).
// A backlog that cycles through somewhat more keys than the cache holds
// (Debezium's snapshot, then rounds of updates over the same keys) then
// still hits often: about 60 % of the time when the cycle is 1.25 times
// the cache, 20 % at twice it, where forgetting the oldest keys first
// misses nearly every time.
//
// The cache is only right while its sink is the only writer of its keys:
// the sink Resets it whenever its fence reads in scd2sink_offsets that
// another writer applied one of the batch's partitions since it last did,
// on rebalances (Sink.Forget) and after a failed transaction, and entries
// change only after a commit (Cache.Apply).
type Cache struct {
	limit, maxBytes int
	m               map[Key]Entry
	bytes           int
}

// Entry is a key's state, packed (pack.go) or, when a value has
// no packed form, as it is. It is small and holds three pointers at most
// (the map's key, mem, l): the collector traces every entry of the map on
// every cycle.
type Entry struct {
	// mem holds the entry's own copy of its key's identity (kn bytes),
	// which the map keeps: a batch's identities share its memory
	// (plan.TablePlan's interning), and a map assignment stores the key it is
	// given, even over an existing entry. A packed state (bn bytes)
	// follows it in the same allocation.
	mem    *byte
	kn, bn uint32
	size   int32 // estimated bytes
	l      *fold.Latest
}

// key returns the entry's own copy of its key's identity ("" if none yet).
func (e Entry) key() string { return unsafe.String(e.mem, e.kn) }

// blob returns the packed state (nil for an entry kept as it is).
func (e Entry) blob() []byte {
	if e.l != nil || e.mem == nil {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(e.mem), e.kn)), e.bn)
}

// State returns the entry's state: a fresh one for a packed entry; the
// kept one, which its users never change, for another. A packed entry
// that does not unpack (it cannot happen: it is pack's own output) is a
// miss, and the key is read from the table.
func (e Entry) State(boxes *change.Boxes, mem *fold.Mem) (*fold.Latest, bool) {
	if e.l != nil {
		return e.l, true
	}
	l, err := unpack(e.blob(), boxes, mem)
	return l, err == nil
}

// Key names a key of one table as the sink knows it: Table is the
// number of the table's description, new each time the sink reads the
// table anew (a column added), so the entries of the old one miss; ID is
// the key's identity.
type Key struct {
	Table uint64
	ID    string
}

// Limit is the most keys the cache holds (0 or less: none).
func (c *Cache) Limit() int { return c.limit }

// Holds reports whether the cache holds k, without unpacking it.
func (c *Cache) Holds(k Key) bool {
	_, ok := c.m[k]
	return ok
}

// New returns an empty cache of at most limit keys (0 or less: none) and,
// when maxBytes is positive, about maxBytes of estimated memory.
func New(limit, maxBytes int) *Cache {
	c := &Cache{limit: limit, maxBytes: maxBytes}
	c.Reset()
	return c
}

// Reset forgets every key.
func (c *Cache) Reset() {
	c.m, c.bytes = map[Key]Entry{}, 0
}

// Get returns k's state, unpacked onto the heap.
func (c *Cache) Get(k Key) (*fold.Latest, bool) {
	e, ok := c.Entry(k)
	if !ok {
		return nil, false
	}
	return e.State(nil, nil)
}

// Entry returns a key's entry; its state is unpacked by the caller,
// outside any lock (a packed entry's blob is never written, and stays
// valid after the cache forgets it).
func (c *Cache) Entry(k Key) (Entry, bool) {
	e, ok := c.m[k]
	return e, ok
}

// Put keeps l as k's state at once (outside a transaction: Ops.Set and
// Cache.Apply do it for one).
func (c *Cache) Put(k Key, l *fold.Latest) {
	if c.limit <= 0 {
		return
	}
	e, _ := newEntry(nil, k, l)
	c.store(k, e)
}

// newEntry packs l, if it can, by way of scratch, which it returns for
// the next one.
func newEntry(scratch []byte, k Key, l *fold.Latest) (Entry, []byte) {
	if b, ok := pack(scratch[:0], l); ok {
		// The key's own copy and the blob share one allocation: one
		// object fewer for the collector per cached key.
		mem := append(append(make([]byte, 0, len(k.ID)+len(b)), k.ID...), b...)
		return Entry{mem: unsafe.SliceData(mem), kn: uint32(len(k.ID)), bn: uint32(len(b)), size: int32(96 + len(mem))}, b
	}
	return Entry{l: detach(l), size: int32(estimate(l, k))}, scratch
}

func (c *Cache) store(k Key, e Entry) {
	old, ok := c.m[k]
	switch {
	case e.mem != nil: // its own copy (a packed entry)
		k.ID = e.key()
	case ok && old.l != nil: // not in a packed entry's memory, which would stay alive
		k.ID = old.key()
		e.mem, e.kn = old.mem, old.kn
	default:
		k.ID = strings.Clone(k.ID)
		e.mem, e.kn = unsafe.StringData(k.ID), uint32(len(k.ID))
	}
	if ok {
		// Out of the map first, so that the eviction below can neither
		// pick k nor count its size twice.
		c.bytes -= int(old.size)
		delete(c.m, k)
	}
	if c.maxBytes > 0 && int(e.size) > c.maxBytes {
		return // larger than the whole cache: forgetting every key would not make room
	}
	for len(c.m) > 0 && (len(c.m) >= c.limit || (c.maxBytes > 0 && c.bytes+int(e.size) > c.maxBytes)) {
		c.evictOne()
	}
	c.m[k] = e
	c.bytes += int(e.size)
}

// evictOne forgets one key, picked at random: the map's iteration starts
// at a random place.
func (c *Cache) evictOne() {
	for k, e := range c.m {
		delete(c.m, k)
		c.bytes -= int(e.size)
		return
	}
}

// Drop forgets k.
func (c *Cache) Drop(k Key) {
	if e, ok := c.m[k]; ok {
		delete(c.m, k)
		c.bytes -= int(e.size)
	}
}

// estimate is the memory an entry holds, in bytes (roughly: the version,
// its key and row values).
func estimate(l *fold.Latest, k Key) int {
	n := 160 + len(k.ID) + len(l.SideMaxSeq)
	for _, a := range l.PrevAbsent {
		n += 16 + len(a)
	}
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

// Ops are the changes one transaction makes to the cache, applied only
// once it has committed (Cache.Apply). States are packed as they are set,
// while the fold has just touched them, not after the commit. An Ops
// belongs to the transaction's goroutine.
type Ops struct {
	Puts  []putOp // in order: a later one for the same key wins
	Drops []Key
	// ResetAll: forget every key (a truncate folded too many to drop).
	ResetAll bool
	scratch  []byte // where states are packed before their exact copy
	// Off: nothing set is kept (no cache, or a batch applied isolating
	// values, after which the cache is emptied).
	Off bool
}

type putOp struct {
	k Key
	e Entry
}

// Set records l as k's state once the transaction commits. l is packed, or
// detached, before Set returns: it may share rows with the batch.
func (o *Ops) Set(k Key, l *fold.Latest) {
	if o.Off {
		return
	}
	var e Entry
	e, o.scratch = newEntry(o.scratch, k, l)
	o.Puts = append(o.Puts, putOp{k, e})
}

// Apply makes the changes of a committed transaction.
func (c *Cache) Apply(o *Ops) {
	if o.ResetAll {
		c.Reset()
		return
	}
	for _, k := range o.Drops {
		c.Drop(k)
	}
	if c.limit <= 0 {
		return
	}
	for _, p := range o.Puts {
		c.store(p.k, p.e)
	}
}
