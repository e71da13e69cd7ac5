package apply

import (
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/history"
	"github.com/scd2sink/scd2sink/sink/statecache"
)

// Ops is what one transaction carries besides its statements: the
// changes it makes to the state cache once it commits, the slabs the
// states it unpacks take their values from, and what it read ahead. It
// belongs to the transaction's goroutine.
type Ops struct {
	statecache.Ops
	// mem holds the values and structs of the states unpacked for the
	// transaction.
	mem fold.Mem
	// Pre is what the transaction read ahead for its tables (history.Prefetch).
	Pre *history.Prefetched
	// Later, when set, takes the tables' small writes, to go to
	// PostgreSQL together (history.Later); its owner runs it before the
	// transaction's next phase. Nil writes each table's share at once.
	Later *history.Later
}
