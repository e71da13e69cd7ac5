package pgcodec

import "github.com/jackc/pgx/v5/pgtype"

// IsText reports whether a column of type oid holds text.
func IsText(oid uint32) bool {
	return oid == pgtype.TextOID || oid == pgtype.VarcharOID || oid == pgtype.BPCharOID || oid == pgtype.NameOID
}

// ClipText shortens s to 60 bytes for an error message.
func ClipText(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}
