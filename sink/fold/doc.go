// Package fold is the reference fold of DESIGN.md section 5 over one key's
// events, in memory: no SQL, no I/O. The sink reads a key's state (or the
// stretch of its history a late event touches) from PostgreSQL, folds the
// new events here, and writes the difference; what is right is decided in
// this package alone.
//
// # What it holds
//
//   - Event: one event as the fold sees it (sequence, operation, time,
//     typed row image, content digest, the columns it lacked or sent as
//     Debezium's unavailable-value placeholder).
//   - Version: one row of a history table, as read from it or as the fold
//     makes it.
//   - Latest: what the append path needs of a key: its latest version, the
//     side table's highest sequence and time for it, and the columns the
//     key's last after image lacked (PrevAbsent).
//   - Shape: what the fold needs of the table (columns, tracked and Type 1
//     positions, deletes and type1_scope).
//   - State and Out: a key's state between events, and what a fold touched.
//   - Mem: the slabs a transaction's fold takes versions, lists and rows
//     from, one allocation per slab instead of one per key.
//   - ValuesEqual, RowsEqual and Canon: the exact comparison of typed
//     values (NULL differs from ” and from 0; decimals compare by value;
//     JSON canonically) that "a tracked column changed" means.
//
// # Invariants
//
//   - Events are folded in sequence order; a key's time never runs
//     backwards: an event's time is max(its own, the key's previous event's
//     time). Where clamping raised it, the event's own time is kept (Raw),
//     because a later re-fold that gains an earlier delete may not clamp.
//   - A create always closes the live version; an update closes it when
//     a tracked column it carries and the version knows differs
//     (Shape.Fold, trackedEqual), or when the live version is one marked
//     deleted (deletes: new_record); otherwise its Type 1 values overwrite the
//     live version's and the event goes to the side list (Out.Side), which
//     the sink keeps in the side table so the key's event list can always
//     be rebuilt from the table.
//   - A delete closes the live version (deletes: close), or closes it and
//     opens a version marked deleted with its values (new_record), or does
//     nothing but go to the side list (ignore). A truncate closes what is
//     live and is no event of the key.
//   - Unavailable-value placeholders resolve against the previous image of
//     the key (resolvePlaceholders copies the row: a retried batch sees the
//     placeholders again). A Latest gives that image as its version's row
//     with the columns the last image lacked NULL (Latest.PrevImage): a
//     column dropped at the source is NULL in the images after the drop,
//     while the version keeps its value, and a placeholder after it comes
//     back takes NULL.
//   - With type1_scope all_versions every version ends up with the Type 1
//     values of the key's last image; the fold leaves that spread to its
//     caller (SpreadType1), which knows which versions exist. Under
//     current_version a version whose row is no longer its opener's image
//     keeps the opener in the side table (OpenerDiffers).
//   - A version's Row is a copy from Mem, never an event's row, so the
//     sink may overwrite its Type 1 values in place. Everything else the
//     fold returns may share an event's row (after placeholders are
//     resolved): a version's Opener, the rows of Out.Side; those are read,
//     never written. Nothing from a Mem outlives its transaction: the
//     state cache packs or detaches what it keeps.
//
// The same fold rebuilds history in a repair: the sink hands it the events
// rebuilt from the versions and side rows read (Version.Event), the first
// marked Resolved so that it starts at its clamped time, and compares what
// comes out with what is stored (Version.SameAs).
package fold
