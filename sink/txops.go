package sink

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/catalog"
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

// table is a history table as the sink works on it: the catalog's
// description of it, and the number the state cache knows this
// description by (a table read anew is a new description, whose keys the
// cache has not seen).
type table struct {
	*catalog.Table
	number uint64
}

// ensureTable brings the target's tables to what spec and the extra
// columns need (catalog.Ensure) and describes them.
func ensureTable(ctx context.Context, pool *pgxpool.Pool, spec TableSpec, extra []change.Column) (*table, error) {
	t, err := catalog.Ensure(ctx, pool, spec, extra)
	if err != nil {
		return nil, err
	}
	return &table{Table: t, number: tableNumbers.Add(1)}, nil
}

// widenColumns widens t's columns named in to (catalog.Widen) and
// describes the table anew.
func widenColumns(ctx context.Context, s *Sink, t *table, to map[string]string) (*table, error) {
	w, err := catalog.Widen(ctx, s.pool, s.log, t.Table, to)
	if err != nil {
		return nil, err
	}
	return &table{Table: w, number: tableNumbers.Add(1)}, nil
}

// cacheKey is the state cache's key of the key identity id in t.
func (t *table) cacheKey(id string) statecache.Key {
	return statecache.Key{Table: t.number, ID: id}
}
