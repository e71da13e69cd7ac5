package plan

import (
	"sync/atomic"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/statecache"
)

// tableNumbers numbers the table descriptions the sinks of this process
// make, for the state cache's keys.
var tableNumbers atomic.Uint64

// Table is a history table as the sink works on it: the catalog's
// description of it, and the number the state cache knows this
// description by (a table read anew is a new description, whose keys the
// cache has not seen).
type Table struct {
	*catalog.Table
	number uint64
}

// NewTable numbers t's description for the state cache.
func NewTable(t *catalog.Table) *Table {
	return &Table{Table: t, number: tableNumbers.Add(1)}
}

// CacheKey is the state cache's key of the key identity id in t.
func (t *Table) CacheKey(id string) statecache.Key {
	return statecache.Key{Table: t.number, ID: id}
}
