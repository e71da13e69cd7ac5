package scdtest

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/sink"
)

func textOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "∅"
	case string:
		return x
	case json.Number:
		return x.String()
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	default:
		return fmt.Sprint(x)
	}
}

func tsText(t *time.Time) string {
	if t == nil {
		return "open"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// deletedText marks a version opened by a delete (deletes: new_record).
func deletedText(deleted bool) string {
	if deleted {
		return " deleted"
	}
	return ""
}

// ModelLines renders the model's versions like HistoryLines renders the table.
func ModelLines(spec sink.TableSpec, cols []string, vs []Version) []string {
	var out []string
	for _, v := range vs {
		var key, vals []string
		for _, k := range spec.Keys {
			key = append(key, textOf(v.row[k]))
		}
		for _, c := range cols {
			vals = append(vals, c+"="+textOf(v.row[c]))
		}
		out = append(out, fmt.Sprintf("%s seq=%s [%s, %s) current=%v%s %s", strings.Join(key, "|"),
			hex.EncodeToString([]byte(v.seq)), tsText(&v.from), tsText(v.to), v.current, deletedText(v.deleted), strings.Join(vals, " ")))
	}
	sort.Strings(out)
	return out
}

// HistoryLines reads a history table, one line per version.
func HistoryLines(t testing.TB, pool *pgxpool.Pool, spec sink.TableSpec, cols []string) []string {
	t.Helper()
	var sel []string
	for _, k := range spec.Keys {
		sel = append(sel, pgx.Identifier{k}.Sanitize()+"::text")
	}
	for _, c := range cols {
		sel = append(sel, pgx.Identifier{c}.Sanitize()+"::text")
	}
	// (scd_deleted exists only in tables that have had deletes: new_record.)
	q := fmt.Sprintf("SELECT %s, valid_from, valid_to, is_current, scd_seq, coalesce((to_jsonb(h)->>'scd_deleted')::boolean, false) FROM %s h", strings.Join(sel, ", "),
		pgx.Identifier{spec.Schema, spec.Target}.Sanitize())
	rows, err := pool.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("reading %s: %v", spec.Target, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		texts := make([]*string, len(sel))
		dest := make([]any, 0, len(sel)+4)
		for i := range texts {
			dest = append(dest, &texts[i])
		}
		var from time.Time
		var to *time.Time
		var cur bool
		var seq []byte
		var deleted bool
		dest = append(dest, &from, &to, &cur, &seq, &deleted)
		if err := rows.Scan(dest...); err != nil {
			t.Fatalf("scanning %s: %v", spec.Target, err)
		}
		str := func(p *string) string {
			if p == nil {
				return "∅"
			}
			return *p
		}
		var key, vals []string
		for i := range spec.Keys {
			key = append(key, str(texts[i]))
		}
		for i, c := range cols {
			vals = append(vals, c+"="+str(texts[len(spec.Keys)+i]))
		}
		out = append(out, fmt.Sprintf("%s seq=%s [%s, %s) current=%v%s %s", strings.Join(key, "|"),
			hex.EncodeToString(seq), tsText(&from), tsText(to), cur, deletedText(deleted), strings.Join(vals, " ")))
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("reading %s: %v", spec.Target, err)
	}
	sort.Strings(out)
	return out
}

// DiffLines returns a readable difference, or "" when equal.
func DiffLines(want, got []string) string {
	w, g := map[string]int{}, map[string]int{}
	for _, l := range want {
		w[l]++
	}
	for _, l := range got {
		g[l]++
	}
	var b strings.Builder
	for _, l := range want {
		if g[l] < w[l] {
			fmt.Fprintf(&b, "  missing: %s\n", l)
			g[l]++
		}
	}
	w2 := map[string]int{}
	for _, l := range want {
		w2[l]++
	}
	for _, l := range got {
		if w2[l] == 0 {
			fmt.Fprintf(&b, "  extra:   %s\n", l)
		} else {
			w2[l]--
		}
	}
	return b.String()
}

// LogDiffKeys logs, for every key a DiffLines difference names, the rows
// the history table and its side table hold with their bookkeeping
// columns: what a failing test needs to tell a wrong fold from a wrong
// read or write.
func LogDiffKeys(t testing.TB, pool *pgxpool.Pool, spec sink.TableSpec, diff string) {
	t.Helper()
	seen := map[string]bool{}
	for _, l := range strings.Split(diff, "\n") {
		l = strings.TrimSpace(l)
		_, rest, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		key, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
		if key == "" || seen[key] {
			continue
		}
		seen[key] = true
		parts := strings.Split(key, "|")
		if len(parts) != len(spec.Keys) {
			continue
		}
		var conds []string
		args := make([]any, len(parts))
		for i, k := range spec.Keys {
			conds = append(conds, fmt.Sprintf("%s::text = $%d", pgx.Identifier{k}.Sanitize(), i+1))
			args[i] = parts[i]
		}
		for _, rel := range []string{spec.Target, spec.Target + "_scd_events"} {
			q := fmt.Sprintf("SELECT to_jsonb(h)::text FROM %s h WHERE %s ORDER BY scd_seq", pgx.Identifier{spec.Schema, rel}.Sanitize(), strings.Join(conds, " AND "))
			rows, err := pool.Query(context.Background(), q, args...)
			if err != nil {
				t.Logf("reading %s for key %s: %v", rel, key, err)
				continue
			}
			var b strings.Builder
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					t.Logf("reading %s for key %s: %v", rel, key, err)
					break
				}
				b.WriteString("  " + s + "\n")
			}
			rows.Close()
			t.Logf("%s rows of key %s:\n%s", rel, key, b.String())
		}
	}
}
