// Package sink applies change events to SCD Type 2 history tables in
// PostgreSQL, exactly as the reference fold of DESIGN.md section 5 defines,
// whatever order the events arrive in and however often they are delivered.
//
// # Tables
//
// For a target T the sink keeps:
//
//   - T, the history table: the source columns, then scd_id (identity),
//     valid_from, valid_to, is_current, scd_seq (the sequence of the event that
//     opened the version), and the bookkeeping columns scd_close_seq (the
//     sequence of the event that closed it), scd_op (the opening operation),
//     scd_hash (a digest of the opening event's content) and scd_unavailable
//     (the columns the opening event sent as Debezium's unavailable-value
//     placeholder), scd_absent (the columns whose value the version does
//     not know: dropped at the source or not added yet when it opened, and
//     for tracked ones not learned since, DESIGN.md section 11), scd_attnum
//     (the highest column position the row's writer knew: columns added
//     later are absent from it) and scd_raw_t (the opening event's own time
//     where clamping raised it). A unique index covers (key columns, scd_seq); the table
//     has fillfactor 70 and no index on the columns a close changes, so
//     closing a version is a HOT update.
//     Under deletes: new_record a delete that closes a live version opens
//     one marked deleted (scd_op 'd', scd_deleted true) with the closed
//     version's row: its opening event is the delete, so the state above
//     rebuilds it like any version. It is live for the fold until the
//     next create or update closes it; a delete meets it as nothing live.
//     It is never a repair's boundary (its row is the version before it's,
//     not its own event's), and a repair read from it starts with it open.
//   - T_current, a view of the current versions (without those marked
//     deleted).
//   - T_scd_events, the side table: every event that opened no version
//     (no-op and Type-1-only updates, deletes), with its sequence, operation,
//     clamped time (and raw time where clamping raised it), content digest,
//     absent columns and row image; and the opening event of a version whose
//     row is no longer its image: Type 1 columns overwritten under
//     type1_scope current_version, or a column added at the source learned
//     from a later event. In a history of mostly tracked changes it stays
//     small: its size is the number of events that changed no tracked column.
//   - scd2sink_truncates in the service schema: every truncate per target.
//   - scd2sink_erasures in the service schema: erased keys, as keyed
//     hashes, never the keys (package erasure). A writer drops the events and
//     dead letters of erased keys after its fence, inside the batch's
//     transaction, so an erase and a batch of the same partitions never
//     interleave; the rest of the fold does not change, because a key's
//     history depends on its own events only.
//   - Retention (package maint) removes a prefix of a key's history: the
//     versions closed before the horizon and the side rows before the first
//     version kept, leaving a side row of operation 'h' at the highest
//     sequence removed. The horizon never passes the watermark, so no late
//     event within the reorder window needs what went.
//   - A partitioned history table (package catalog) keeps its current
//     versions in one partition and its closed ones by valid_to; a
//     writer creates the partition a version closes into inside the
//     batch's transaction, before its statements, so no row ever lacks one.
//
// # Why this state is enough
//
// A key's full event list can be rebuilt from the table: the side rows, plus
// the opening event of every version that has no side row (its row image is
// the version's row, its time the version's valid_from), plus the table's
// truncates. After retention it is the suffix of that list from the first
// event kept, whose stored state stands for everything removed before it;
// events before it are dead letters (reason expired). The versions' rows keep the opening event's tracked values
// verbatim; only Type 1 columns are overwritten, and that is harmless:
// with all_versions every version ends up with the Type 1 values of the key's
// last event anyway, and with current_version the opener's own image is
// saved in the side table before its first overwrite.
//
// Times are stored clamped (t = max(valid_from, t of the previous event)),
// and where that raised an event's time its own time is kept too
// (scd_raw_t): a re-fold starts from the raw times. Clamped times alone are
// not enough, because a truncate moves a key's time only where it closes a
// version: a late delete before the truncate gives the events after it
// their own times back. (Rows written before scd_raw_t fold from their
// clamped time, which is exact but for that case.)
//
// Tracking is by value over the columns both sides carry (DESIGN.md
// section 11): an event compares with the live version over the tracked
// columns it carries and the version knows. A column the version does not
// know takes its value from the first later event that carries it (the
// current version shows a column added at the source at once), and the
// version's opener is then kept in the side table, so a re-fold starts from
// the image it really had.
//
// # Where a batch goes
//
// The consumer (package consumer) reads records (take.go: fetchErrors,
// decodeAll with package debezium, notePositions, sequence), lets the
// sequencer order them per key and hold them for the reorder window, and
// cuts the released events into a Batch (batch.go). From there:
//
//  1. Prepare (apply.go) brings every target's tables to the batch's
//     columns (the registry, registry.go and registry_ddl.go, with package
//     catalog's DDL), then package plan converts each event to the
//     columns' types into a fold.Event, grouped by table and key
//     (plan.TablePlan, plan.KeyPlan); what cannot be converted becomes a
//     dead letter. CPU and DDL only.
//  2. ApplyPrepared (apply.go, parallel.go) cuts the batch into parts of
//     disjoint partitions when apply_workers allows (cut.go: the one way
//     to cut, by partitions here, by targets for parking), and
//     applyOne applies each in one transaction, batchTx (batchtx.go), in
//     three phases, one call per part:
//  3. before: the fence and writers' locks (the Ledger, ledger_offsets.go,
//     ledger_locks.go), truncates of tables not yet created, replay marks
//     (ledger_replay.go), erased keys dropped (package erasure), then one
//     pipeline reading ahead every table's truncates, uncached keys'
//     latest versions and column types (package history's Prefetch).
//  4. the tables: package apply folds each target's share — the append
//     path from the state (the Sink's memory, memory.go and package
//     statecache, or the read-ahead), the repair path from the stretch of
//     history package history reads back — and package history writes
//     the changes set-based (COPY, unnest).
//  5. after: dead letters, completed snapshots (reconcile.go) and the
//     batch's offsets are written in the same transaction (the Ledger),
//     which commits; only then does the state cache take the
//     transaction's changes (memory.go) and the consumer commit the
//     offsets to Kafka (consumer/commit.go).
//
// Maintenance (verify, retention, partitions ahead, claims: package
// maint; erase: package erasure) reaches the Sink through upkeepView
// (upkeep.go): the specs, the tables, and the writers' locks.
//
// # Applying a batch
//
// One transaction per batch. Events are converted to the target's column
// types (failures become dead letters), grouped by table and key, sorted by
// sequence, and repeated events inside the batch dropped (same content) or
// dead-lettered (other content: the first one wins).
//
// The append path covers keys whose new events all come after everything the
// table holds for them (compared with the latest version's opening and
// closing sequence and the side table's highest sequence). One query reads
// the latest version of every such key (and, for keys whose new events
// hold placeholders, a second one the columns their last after image
// lacked when that image is a side row: package history's ReadPrevAbsent); the
// fold runs in Go; then, for all
// keys at once: one UPDATE closes versions (by scd_id, through unnest), one
// COPY inserts new versions, one COPY inserts side rows, and with
// all_versions one UPDATE spreads changed Type 1 values to older versions.
//
// The repair path covers keys with a late or repeated event: their history
// is read from the version before the latest one opened at or before the
// earliest new event's sequence, or the one before that when it is
// marked deleted (the whole of it for a truncate's re-fold, or when
// fewer versions come before) up to a boundary: the first version
// after the new events that opened at or after their times, unclamped and
// without placeholders (package history's Bound); when the fold still opens it as
// stored, nothing from it on can change, else the rest is read too; the event list rebuilt, the first
// event taken as resolved (it starts the fold, as the state before it
// would; nothing before it can change but all_versions' Type 1 values,
// given by one bulk update and audited), the new events added (an event
// whose sequence is already there is a duplicate if its digest matches, else
// a conflict for the dead-letter table), folded from scratch, and the
// difference written: versions matched by opening sequence are updated in
// place (their scd_id survives), others inserted or deleted; side rows
// likewise. The audit row of a repair holds the versions it touched (at
// most 1,000 a side). A truncate re-folds every key that had a version
// live at its sequence, read in key order 5,000 keys at a time
// (package apply's truncate.go), so memory holds one chunk, not the table. Re-applying an
// applied event therefore changes nothing.
//
// Dead letters and the batch's Kafka offsets (scd2sink_offsets) are written
// in the same transaction. Errors are classified by SQLSTATE (Classify,
// retry.go) and returned: the Sink never retries a batch, its caller
// does, with internal/retry's one loop — the consumer for as long as
// transient ones (connections, serialization, resources, lock and
// statement timeouts, a read-only failover) last, slowly for blocked ones
// (a table changed by hand, a missing privilege); anything else stops.
// Only maintenance (erase, retention, verify, partitions ahead, a
// reconciliation's chunks) retries its own steps, with the same loop. A
// failure in one target's statements (or its DDL) is a TargetError
// naming it; when ParkTarget says waiting cures it (blocked and data
// errors, lock and statement timeouts) the consumer parks that target
// while the others go on: Prepared.Split cuts a batch along targets, which
// is exact for the reason parts are (Split, below), and ApplyPart applies the
// parked target's probe beside later batches.
//
// DDL runs only for what the catalog lacks (package catalog): a restart with
// nothing to change takes no lock stronger than its DML, and what DDL
// runs waits at most lock_timeout.
//
// A value PostgreSQL rejects (SQLSTATE class 22 or 23) fails the batch; it
// is then applied again with each table's keys bisected under savepoints
// (package apply's isolate.go) until the events carrying such values are found: they become
// dead letters with the database's message, everything else is applied.
// Applying a batch in parts inside one transaction is safe because keys do
// not interact and the fold gives the same history whether a key's events
// arrive in one batch or several. The same argument lets a batch holding
// the create of a primary-key change apply its other keys first, so that
// the create's placeholders can be resolved from the old key's version in
// the table (package apply's keychange.go).
//
// # Values
//
// Events decoded with a schema carry typed values (change.RowDecoder); the
// converter turns them into exactly what pgx returns when it reads the
// column back, so an event's value and the stored one compare equal:
// integers sized to the column, pgtype.Numeric with its scale, times
// truncated to microseconds, infinities as pgtype values, timetz in a codec
// of its own, arrays element by element. JSON columns are read and written
// as their text (json.RawMessage) and compared canonically (fold.ValuesEqual), as
// jsonb compares them.
//
// # Limits
//
// Key columns must not be NULL (such events are dead-lettered). A truncate
// re-folds every key live at its sequence in one transaction: bounded in
// memory, but for very large tables slow (200,000 keys: about 17 s). A late
// event reads its key's history from the version before it up to the
// boundary after it into memory; without a boundary (a truncate after it,
// or none among the next 64 versions) it reads every version after it.
// With all_versions, a late event whose Type 1 values become the key's last
// gives them to the versions not read with one bulk update. The create of a
// primary-key change whose old key is not in the table yet stores NULL for
// its placeholder columns.
package sink
