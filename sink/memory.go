package sink

import (
	"sync"
	"sync/atomic"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/statecache"
)

// memory is what a Sink remembers between batches of what it wrote: its
// keys' latest states (the state cache), the offset it last recorded per
// partition, what its fences last saw of other writers, and which topics
// were resized. All of it is a shortcut: forgetting it (Forget, a fence
// that finds another writer's offsets or a reconciliation, a failed
// batch) costs reads, never exactness, because a key's state is read
// from the table whenever it is not remembered.
//
// Forget may be called from a rebalance callback while a batch is still
// being applied (one abandoned after the revoke budget): it only bumps
// forgets, and the applying goroutines, the only ones touching the rest
// (under mu, as the parts of a batch are applied side by side), empty it
// when they next look (forgetNow).
type memory struct {
	mu    sync.Mutex
	cache *statecache.Cache
	// written is the offset this Sink last recorded per partition; another
	// value in scd2sink_offsets means another writer applied that partition.
	written map[change.Partition]int64
	// seen is, for partitions of resized topics this Sink does not write,
	// the offset the fence last saw; resized are the topics its fences
	// found resized (ledger_topics.go).
	seen    map[change.Partition]int64
	resized map[string]bool
	// forgets counts Forget calls; forgot is the count last acted on.
	forgets atomic.Uint64
	forgot  uint64
	// reconciled is the count of reconciled snapshots and outside writes
	// the fence last saw (-1: none seen yet).
	reconciled int64
}

func newMemory(keys, bytes int) *memory {
	return &memory{cache: statecache.New(keys, bytes), written: map[change.Partition]int64{}, seen: map[change.Partition]int64{},
		resized: map[string]bool{}, reconciled: -1}
}

// forget asks the applying goroutines to empty the memory; it never waits.
func (m *memory) forget() { m.forgets.Add(1) }

// forgetNow acts on forget calls made since the last look and returns the
// count acted on.
func (m *memory) forgetNow() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.forgetLocked()
}

// forgetLocked is forgetNow with mu held.
func (m *memory) forgetLocked() uint64 {
	if g := m.forgets.Load(); g != m.forgot {
		m.cache.Reset()
		m.written = map[change.Partition]int64{}
		m.seen = map[change.Partition]int64{}
		m.forgot = g
	}
	return m.forgot
}

// cached returns a key's state remembered between batches, its values
// boxed from boxes.
func (m *memory) cached(k statecache.Key, boxes *change.Boxes, mem *fold.Mem) (*fold.Latest, bool) {
	m.mu.Lock()
	e, ok := m.cache.Entry(k)
	m.mu.Unlock()
	if !ok {
		return nil, false
	}
	return e.State(boxes, mem)
}

// holds reports whether the state cache holds k, without unpacking it.
func (m *memory) holds(k statecache.Key) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cache.Holds(k)
}

// anyResized reports whether a topic of positions was found resized: its
// writers take turns on the topic's lock (ledger_topics.go).
func (m *memory) anyResized(positions map[change.Partition]Position) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for part := range positions {
		if m.resized[part.Topic] {
			return true
		}
	}
	return false
}

// noteResized remembers topics a fence found resized.
func (m *memory) noteResized(topics []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range topics {
		m.resized[t] = true
	}
}

// lastReconciled is the count the fences last saw.
func (m *memory) lastReconciled() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reconciled
}

// committed takes what a batch's transaction (or part) did once it has
// committed, unless a Forget came since gen (what it applied was then
// never to be kept): the state cache's changes (ops), unless savepoints
// rolled some of them back (isolated) or another part's fence saw a
// reconciliation after this one's (reconciled, what this one's saw), and
// the positions it recorded.
func (m *memory) committed(gen uint64, ops *statecache.Ops, isolated bool, reconciled int64, positions map[change.Partition]Position) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forgetLocked() != gen {
		return
	}
	if isolated || m.reconciled != reconciled {
		m.cache.Reset()
	} else {
		m.cache.Apply(ops)
	}
	for part, pos := range positions {
		m.written[part] = pos.Offset
	}
}

// failed forgets the keys' states after a batch failed: what the cache
// holds may be ahead of the table.
func (m *memory) failed() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cache.Reset()
}

// recorded is a partition's offset as scd2sink_offsets holds it.
type recorded struct {
	part   change.Partition
	offset int64
}

// sawFence compares what a batch's fence read — the count of reconciled
// snapshots and outside writes, and the recorded offsets of the batch's
// partitions (mine) and of its resized topics' other partitions — with
// what this Sink remembers, and forgets the keys' states when another
// writer wrote meanwhile. It reports whether the count moved.
func (m *memory) sawFence(reconciled int64, recs []recorded, mine map[change.Partition]Position) (moved bool) {
	m.mu.Lock() // the other parts of the batch look too (parallel.go)
	defer m.mu.Unlock()
	if reconciled != m.reconciled {
		moved = true
		if m.reconciled >= 0 {
			m.cache.Reset()
		}
		m.reconciled = reconciled
	}
	for _, r := range recs {
		if w, ok := m.written[r.part]; ok && w == r.offset {
			continue // as this Sink left it
		}
		if _, ok := mine[r.part]; !ok {
			// Another partition of a resized topic: unchanged since the
			// last look, nobody wrote through it meanwhile.
			if seen, ok := m.seen[r.part]; ok && seen == r.offset {
				continue
			}
			m.seen[r.part] = r.offset
		}
		m.cache.Reset()
	}
	return moved
}
