// Package pgcodec encodes what the sink writes to PostgreSQL: rows for
// COPY … FROM STDIN (FORMAT binary) built straight into the buffer the
// connection sends (CopyIn), arrays for statements over unnest in
// PostgreSQL's binary form, each element as a COPY field (RawArray), the
// binary codecs of the common column types registered on every
// connection (Register: raw JSON text, fast timestamps, dates and
// numerics, timetz, which pgx has no type for, and RawArray's plan).
//
// Invariants: every value is encoded exactly as pgx's own codecs would
// encode it for the column's type (TestCopyValueMatchesPgx,
// TestFastCodecsMatchPgx, TestRawArrayMatchesPgx compare them byte for
// byte), anything the fast paths do not cover goes to pgx's type map, and
// a COPY's column types are those of the table as locked in the same
// transaction (a describe, or types read after the same lock), never
// remembered from an earlier transaction: a column widened by another
// instance from bigint to numeric would otherwise take the old binary
// form without an error. An array's type is named by its statement's
// cast, which PostgreSQL converts from.
package pgcodec
