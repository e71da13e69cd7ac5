// Package apply folds one table's share of a batch (plan.TablePlan) into
// its history inside the batch's transaction: keys whose events all come
// after what the table holds take the append path (their latest state,
// cached or read, folded forward); the others are repaired — their
// history from the late event on read back (package history), folded
// again with the batch's events, and rewritten where it changed.
// Primary-key changes whose new key's image has unavailable-value
// placeholders take two steps (the old key first); a truncate folds every
// key it closes again; a value PostgreSQL rejects is isolated under a
// savepoint and dead-lettered alone.
//
// An Applier keeps nothing between batches but a counter: what a batch
// reads it reads in its own transaction (or from the state cache, whose
// entries the sink only commits with the transaction, Ops), so a batch
// redelivered or applied again after a crash folds to the same history
// (fold's reference semantics, DESIGN.md section 5). It runs no DDL but
// the partitions a partitioned table needs for the versions it writes
// (package history's Writes.Exec, catalog's Parts), and takes no lock
// beyond those and the rows it writes; the sink took the table locks
// and the fence before it. Result counts what it did.
package apply
