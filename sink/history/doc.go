// Package history holds the only SQL the sink runs against a history
// table, its side table, its repairs table and its key directory while a
// batch is applied: reading keys' latest states (LoadLatest, Prefetch,
// ReadPrevAbsent, RowBefore), their whole or partial histories for a
// repair (Load, LoadFrom), the keys a truncate closes (LiveKeys), the
// truncates recorded (LoadTruncates, RecordTruncate), and writing one
// table's changes of a batch set-based (Writes.Exec: COPY and unnest,
// never a statement per key).
//
// It runs inside the caller's transaction and keeps no state between
// calls: a Writes belongs to one table's share of one batch, a
// Prefetched to one transaction. Statements are built from the
// catalog's description of the table (plan.Table) and quote every name;
// values go as parameters. The caller holds the locks: Prefetch takes
// only ACCESS SHARE on the tables it reads ahead (the lock a COPY's
// describe would take), so readers of the history are never blocked.
//
// Invariants: what Writes.Exec writes is exactly what the fold decided
// (versions closed and opened, side rows, Type 1 updates) — it decides
// nothing; a state read here is the table's as of the transaction, so a
// state cached by the caller and one read here agree once the
// transaction commits.
package history
