// Package statecache remembers, between a sink's transactions, what the
// append path last wrote for a key (fold.Latest: its latest version, the
// side table's highest sequence and time, and the columns the last after
// image lacked), so that the next batch of the key need not read it back
// from PostgreSQL.
//
// # Invariants
//
//   - An entry is exactly what the table holds for its key once the
//     transaction that set it committed: a transaction records its
//     changes in Ops (Set, Drops, ResetAll), and Cache.Apply makes them
//     only after the commit. A transaction that failed has its Ops
//     dropped, and the sink empties the cache instead (Reset), as it does
//     after a batch applied by isolating values.
//   - It is right only while its sink is the only writer of the key's
//     partitions. The sink empties it (Reset) whenever scd2sink_offsets
//     shows another writer applied one of a batch's partitions since, on
//     rebalances, after a failed transaction or a batch applied by
//     isolating values, when a reconciliation committed while a part of
//     the batch was applied, and after a truncate that folded too many
//     keys to drop one by one.
//   - A key is named by its table description's number and its identity
//     (Key): a table read anew (a column added) gets a new number, and the
//     old description's entries miss.
//   - Nothing kept shares memory with a batch: a state is packed into one
//     byte slice of its own (pack.go) or, when a value has no packed form,
//     detached (deep-copied); the map's key is the entry's own copy of the
//     identity. A batch's rows, slabs and raw messages can therefore be
//     reused as soon as its transaction ends.
//   - It is bounded by keys and by estimated bytes. When full it forgets
//     keys picked at random, so a backlog that cycles through somewhat
//     more keys than it holds still hits often (TestStateCacheCycle);
//     the two generations it had before, which forgot the older half
//     whole, missed nearly every time on such a cycle. A state larger
//     than the whole bound is not kept.
//
// A Cache is not safe for concurrent use: the sink guards it with a mutex
// and unpacks states outside it (Entry, then Entry.State).
package statecache
