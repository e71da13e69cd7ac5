package sink

import (
	"sync/atomic"

	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/statecache"
)

// cacheOps is what one transaction carries besides its statements: the
// changes it makes to the state cache once it commits, the slabs the
// states it unpacks take their values from, and what it read ahead. It
// belongs to the transaction's goroutine.
type cacheOps struct {
	statecache.Ops
	// mem holds the values and structs of the states unpacked for the
	// transaction.
	mem fold.Mem
	// pre is what the transaction read ahead for its tables (prefetch.go).
	pre *prefetched
}

// tableNumbers numbers the table descriptions the sinks of this process
// make, for the state cache's keys.
var tableNumbers atomic.Uint64

// cacheKey is the state cache's key of the key identity id in t.
func (t *table) cacheKey(id string) statecache.Key {
	return statecache.Key{Table: t.number, ID: id}
}
