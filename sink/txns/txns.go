// Package txns keeps what exact completeness needs (DESIGN.md section
// 14): which events of each source transaction have been applied, and
// what each transaction's END record says it holds. The tables and the
// horizon view are catalog's (catalog/transactions.go); this package
// writes and prunes their rows.
//
// Invariants, and why the state kept is enough:
//   - An applied event's mark (Applied) is written in the transaction
//     that applies it, beside its offset: a mark exists exactly when its
//     event committed, whatever crashed, and across every member of the
//     group, since they share the table. Marks are distinct per
//     (transaction, collection, total_order): a redelivered event counts
//     once.
//   - An END is written with the position of the transaction topic's
//     partition past it (Reads.Record), in one transaction that first
//     takes the topic's advisory lock and skips what the stored position
//     has passed: members reading the same topic record each END once,
//     and a restart reads on from the stored position.
//   - A transaction's rows go (Reads.Maintain) only once it and every
//     transaction committed before it are complete (or given up): the
//     horizon then no longer depends on them, only on the earliest
//     incomplete one and the last END's time, which the reads table
//     keeps. A transaction still missing
//     events ten minutes after its END was read, and ten minutes of valid
//     time after every partition of its topics was applied past it, is
//     given up (its missing events were dead-lettered undecodable, or
//     never come): logged, and no longer holding the horizon. An END
//     that cannot be decoded holds the horizon as a transaction of its
//     own that never completes, until it is given up likewise.
//   - Every key is scoped by the transaction topic: two connectors'
//     transaction ids never meet.
package txns

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/catalog"
)

// Mark is one applied event's place in its source transaction.
type Mark struct {
	// Topic is the transaction topic whose END counts the event.
	Topic      string
	ID         string
	Collection string
	Order      int64
	// At is the event's valid time: the transaction is bounded by its
	// earliest applied event's too (a source whose END time runs late).
	At time.Time
}

// Applied records marks in tx, the batch's transaction, for group.
// Rows are inserted in key order (marks is sorted in place), so that two
// members' batches never wait on each other in a cycle; a mark already
// there is left alone.
func Applied(ctx context.Context, tx pgx.Tx, schema, group string, marks []Mark) error {
	if len(marks) == 0 {
		return nil
	}
	sorted := marks
	sort.Slice(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.ID != b.ID {
			return a.ID < b.ID
		}
		if a.Collection != b.Collection {
			return a.Collection < b.Collection
		}
		return a.Order < b.Order
	})
	topics, ids, colls := make([]string, len(sorted)), make([]string, len(sorted)), make([]string, len(sorted))
	orders, at := make([]int64, len(sorted)), make([]*time.Time, len(sorted))
	for i := range sorted {
		m := &sorted[i]
		topics[i], ids[i], colls[i], orders[i] = m.Topic, m.ID, m.Collection, m.Order
		if !m.At.IsZero() {
			at[i] = &m.At
		}
	}
	_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.%s (consumer_group, topic, id, collection, total_order, at)
		SELECT $1, x.t, x.id, x.c, x.o, x.a FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::timestamptz[])
			WITH ORDINALITY AS x(t, id, c, o, a, i)
		ORDER BY x.i ON CONFLICT DO NOTHING`, pgx.Identifier{schema}.Sanitize(), catalog.TransactionEventsTable),
		group, topics, ids, colls, orders, at)
	if err != nil {
		return fmt.Errorf("recording the applied events' transactions: %w", err)
	}
	return nil
}
