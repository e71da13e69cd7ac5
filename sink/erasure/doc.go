// Package erasure erases keys (DESIGN.md section 12) and keeps them out.
// Erase removes every trace of a key —
// its versions, side rows, repair audits and dead letters — in one
// transaction per target, and records the erasure in scd2sink_erasures
// as a keyed hash of the key's identity (HMAC-SHA256 under
// the sink's erasure secret), never the key. The table is a log: a row per
// erasure and per lift, the latest row of a (target, hash) deciding.
//
// Every writer keeps the set of erased hashes per table and drops the
// events (and dead letters) of erased keys after its fence, inside the
// batch's transaction, before anything is written: an erase takes the
// locks of every partition recorded for its target's topic, so a batch of
// those partitions either committed before it (and its rows are erased)
// or fences after it; the erase bumps every group's outside-writes count,
// so that fence sees it, forgets its cached states and reloads the set.
//
// A Set is what a Sink knows of erased keys: their hashes per table, read
// again whenever it is made Stale, and how to read a dead letter's key
// back in every form it may take (erasekeys.go), so that an erased key
// is recognised whatever type its values arrived as. The hashes are
// enough: a key is compared by the hash of its identity (plan.KeyID) or,
// for a form that cannot be typed, of its values as text; no key is
// kept in the clear.
package erasure
