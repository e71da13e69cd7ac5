// Package catalog manages the tables the sink writes: for each target the
// history table, its side table <target>_scd_events, its repair audit
// <target>_scd_repairs, the view <target>_current, the function
// <target>_as_of, the configured views and, for a partitioned history
// table, its partitions. It creates and upgrades them (Ensure), widens
// their columns when the source does (Widen), and describes them as they
// are in the database (Table), which is what the sink's transactions work
// from. It runs no DML.
//
// # Invariants
//
//   - DDL runs only for what the catalog lacks or has otherwise (Ensure
//     reads it first, ReadCatalog): a restart with nothing to change takes
//     no lock stronger than its DML. What DDL runs, runs in one
//     transaction under an advisory lock per table (InDDLTx), each
//     statement waiting at most lock_timeout for its table lock, so two
//     instances adopting a table at once do not race and readers of the
//     history never queue behind a long wait.
//   - A Table describes the table as read back after its DDL, never as
//     configured: an existing table's column types win over the config's,
//     columns of an older scd2sink are added with defaults that need no
//     rewrite, and a table that lost a key column is a DriftError (a slow
//     retry), not a crash. A description is not changed once made but by
//     load; a widened table is described anew (Widen returns a new Table).
//   - A view the sink created carries a digest of its definition as its
//     comment, so an unchanged view is never replaced (and never takes
//     its ACCESS EXCLUSIVE lock again).
//   - Names derived from a target (NamesOf) stay within PostgreSQL's 63
//     bytes for targets of up to 51 bytes (but the side index's old name,
//     looked for only where it fits); longer identifiers are compared as
//     PostgreSQL truncates them (Ident).
//   - A partitioned history table is LIST (is_current): current versions
//     in <t>_pcur, closed ones in <t>_pold by RANGE of valid_to, one
//     partition per interval, with no DEFAULT partition (attaching next
//     to one would lock it against readers). Partitions.Ensure creates
//     the ones a batch closes versions into inside the batch's
//     transaction, before its statements, so no row ever lacks one;
//     Partitions remembers only what committed transactions read.
//
// The conversion of event values to the columns' types, and every
// statement that reads or writes rows, belong to the sink.
package catalog
