package catalog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"go.uber.org/zap"
)

// Widened source types (DESIGN.md section 11, schema_changes: evolve): when
// an event's schema gives a column a type that holds every value of the
// column's type and more (int16 to int32 to int64, float32 to float64,
// date to timestamp), the history and side tables' column is altered to
// it, in one transaction with the views that read it dropped and created
// again (readers see the old or the new definition, never none), under
// lock_timeout. Strings and decimals need none: they are text and
// unconstrained numeric from the start. A change alone opens no version:
// values compare equal across the two types. Other instances' statements
// prepared for the old type are prepared again (Classify: 0A000).

// wider lists, per column type, the types it widens to.
var wider = map[string][]string{
	"smallint": {"integer", "bigint", "numeric"},
	"integer":  {"bigint", "numeric"},
	"bigint":   {"numeric"},
	"real":     {"double precision"},
	"date":     {"timestamp without time zone", "timestamp with time zone"},
	// MySQL's TIME, mapped to time before it was known to be a duration.
	"time without time zone": {"interval"},
}

// CanonicalType spells a schema's type as format_type does.
func CanonicalType(t string) string {
	if base, ok := strings.CutSuffix(t, "[]"); ok {
		return CanonicalType(base) + "[]"
	}
	switch t {
	case "timestamp":
		return "timestamp without time zone"
	case "timestamptz":
		return "timestamp with time zone"
	case "time":
		return "time without time zone"
	case "timetz":
		return "time with time zone"
	}
	return t
}

// Dropped lists the table's non-key source columns a schema's columns
// lack, of those older than a column the schema has: a schema that lacks
// only columns added after all of its own is an older one (a partition
// behind, a replay), not a drop.
func (t *Table) Dropped(cols []change.Column) []string {
	has := map[string]bool{}
	var newest int16
	for _, c := range cols {
		has[Ident(c.Name)] = true
		if i, ok := t.Index[Ident(c.Name)]; ok {
			newest = max(newest, t.Cols[i].Attnum)
		}
	}
	var out []string
	for _, c := range t.Cols {
		if !c.Key && !has[c.Name] && c.Attnum < newest {
			out = append(out, c.Name)
		}
	}
	return out
}

// textTypes are the column types a string's values go to as they are.
var textTypes = map[string]bool{"text": true, "character varying": true, "character": true, "citext": true}

// Holds reports whether a column of type col takes a schema's type typ as
// it is, for schema_changes: fail: the same type, a type col widens
// (an older schema, or a narrowing: every value fits), or the same family
// in a table created by hand (varchar for a string, json for JSON, either
// timestamp for a timestamp).
func Holds(col, typ string) bool {
	typ = CanonicalType(keyType(typ))
	colBase, colArr := strings.CutSuffix(col, "[]")
	typBase, typArr := strings.CutSuffix(typ, "[]")
	if colArr != typArr {
		return false
	}
	switch {
	case colBase == typBase, Widens(typBase, colBase):
		return true
	case typBase == "text":
		return textTypes[colBase]
	case typBase == "jsonb":
		return colBase == "json"
	case strings.HasPrefix(typBase, "timestamp"):
		return strings.HasPrefix(colBase, "timestamp")
	}
	return false
}

// Widens reports whether a column of type from takes type to without
// losing a value.
func Widens(from, to string) bool {
	to = CanonicalType(to)
	for _, w := range wider[from] {
		if w == to {
			return true
		}
	}
	return false
}

// Widen alters t's columns named in to (name → new type), with its
// side table's, recreating the views over them, and returns the table as
// it is afterwards. The pool's connections are reset: their prepared
// statements and COPY descriptions know the old types.
func Widen(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger, t *Table, to map[string]string) (*Table, error) {
	names := make([]string, 0, len(to))
	for n := range to {
		names = append(names, n)
	}
	sort.Strings(names)
	var alters []string
	for _, n := range names {
		alters = append(alters, fmt.Sprintf("ALTER COLUMN %s TYPE %s", pgx.Identifier{n}.Sanitize(), CanonicalType(to[n])))
	}
	spec := t.Spec
	drops := []string{t.View.Sanitize(), t.consistentID().Sanitize()}
	for _, v := range spec.Views {
		drops = append(drops, pgx.Identifier{spec.Schema, v.Name}.Sanitize())
	}
	stmts := []string{
		"DROP VIEW IF EXISTS " + strings.Join(drops, ", "),
		fmt.Sprintf("ALTER TABLE %s %s", t.Hist.Sanitize(), strings.Join(alters, ", ")),
		fmt.Sprintf("ALTER TABLE %s %s", t.Side.Sanitize(), strings.Join(alters, ", ")),
	}
	if t.Parts != nil {
		// The key directory holds the key columns (and only those).
		var keyAlters []string
		for i, n := range names {
			if slices.Contains(spec.Keys, n) {
				keyAlters = append(keyAlters, alters[i])
			}
		}
		if len(keyAlters) > 0 {
			stmts = append(stmts, fmt.Sprintf("ALTER TABLE IF EXISTS %s %s", t.Parts.Dir().Sanitize(), strings.Join(keyAlters, ", ")))
		}
	}
	stmts = append(stmts, currentView("CREATE", t.View, t.Hist, t.DeletedCol), t.consistentView("CREATE"))
	views, err := t.ViewStatements(ctx, pool) // read before they are dropped
	if err != nil {
		return nil, err
	}
	stmts = append(stmts, views...)
	if err := InDDLTx(ctx, pool, "scd2sink table "+t.Hist.Sanitize(), stmts); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "0A000" || pgErr.Code == "2BP01") {
			// A view or rule of someone else's reads the column: the
			// events wait (a slow retry) until it is dropped, or the
			// column widened by hand.
			return nil, &DriftError{Table: t.Hist.Sanitize(), What: fmt.Sprintf(
				"the source widened %s to %s, but a view or rule not scd2sink's reads it (%v): drop it, or alter the column by hand",
				strings.Join(names, ", "), CanonicalType(to[names[0]]), pgErr.Message)}
		}
		return nil, fmt.Errorf("widening %s of %s: %w", strings.Join(names, ", "), t.Hist.Sanitize(), err)
	}
	var what []string
	for _, n := range names {
		what = append(what, n+" "+CanonicalType(to[n]))
	}
	pool.Reset() // the connections' statements and COPY descriptions know the old types
	log.Info("source column types widened: history table altered", zap.String("table", t.Hist.Sanitize()), zap.Strings("columns", what))
	return Ensure(ctx, pool, spec, nil)
}
