package catalog

import (
	"strings"
	"unicode/utf8"
)

// Ident is name as PostgreSQL keeps it: at most 63 bytes, cut at a
// character boundary (longer identifiers are truncated, with a NOTICE).
func Ident(name string) string {
	const max = 63
	if len(name) <= max {
		return name
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut]
}

// QuoteLiteral quotes s as an SQL string literal.
func QuoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
