package sink

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/sink/erasure"
	"go.uber.org/zap"
)

// Ledger is what the batches' transactions record beside the history, in
// the service's tables: the offsets and anchors per partition (the fence
// that serialises writers of a partition, and what rebalances read back),
// the dead letters, the replayed dead letters' marks, the partition counts
// of topics, the outside-writes count, and the completeness watermark's
// looks. A batch writes its part of the ledger in its own transaction
// (applyOne); the reads are for the consumer's rebalances, its watermark
// loop and the commands. Its methods are safe for concurrent use: the
// state is in PostgreSQL, and what it keeps in memory (memory's fence
// marks) has its own lock.
type Ledger struct {
	// schema holds the service's tables; group is the consumer group
	// whose progress is recorded; deadLetters is its dead-letter table.
	schema, group, deadLetters string
	pool                       *pgxpool.Pool
	log                        *zap.Logger
	// mem is told what a fence saw (a writer elsewhere, resized topics).
	mem *memory
	// erasures are made stale by a fence that saw an outside write.
	erasures *erasure.Set
	// spec gives a target's spec.
	spec func(target string) (TableSpec, bool)
}
