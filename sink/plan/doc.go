// Package plan turns a batch's change events into per-table, per-key
// plans: each event converted to its history columns' types (Converter)
// into a fold.Event, grouped by table (TablePlan) and key (KeyPlan), and
// the events that cannot be converted made dead letters (DeadLetter).
//
// It is CPU only: no SQL, no I/O. A Planner's fields are scratch reused
// batch after batch, so one goroutine uses it at a time; a plan refers to
// the Table descriptions it was made for. Once made, a plan's events are
// not changed; the sink's erasure filter only takes erased keys out of
// it (in the batch's transaction), and SubPlan takes parts of it.
//
// Invariants: a key's identity (KeyID) is the same text for equal keys
// whatever Go type their values arrive as, so that the state cache, the
// erasure hashes and the history's rows agree; a Table's number changes
// whenever its description is read anew, so the state cache never serves
// a state unpacked for other columns.
package plan
