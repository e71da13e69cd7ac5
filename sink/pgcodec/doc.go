// Package pgcodec encodes what the sink writes to PostgreSQL: rows for
// COPY … FROM STDIN (FORMAT binary) built straight into the buffer the
// connection sends (CopyIn), the binary codecs of the common column
// types registered on every connection (Register: raw JSON text, fast
// timestamps, dates and numerics, and timetz, which pgx has no type for).
//
// Invariants: every value is encoded exactly as pgx's own codecs would
// encode it for the column's type (TestCopyValueMatchesPgx,
// TestFastCodecsMatchPgx compare them byte for byte), anything the fast
// paths do not cover goes to pgx's type map, and a COPY's column types are
// those of the table as locked in the same transaction (a describe, or
// types read after the same lock), never remembered from an earlier
// transaction: a column widened by another instance from bigint to numeric
// would otherwise take the old binary form without an error.
package pgcodec
