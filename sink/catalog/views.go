package catalog

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ViewSpec is a presentation of a history table in another convention
// (DESIGN.md section 3): a view in the target's schema showing scd_id,
// valid_from, valid_to, is_current and the source columns (and
// scd_deleted where the table has it), renamed by Columns.
type ViewSpec struct {
	Name string
	// Columns maps column names to the names the view shows.
	Columns map[string]string
	// Day: one row per version that was valid at the end of at least one
	// day in TimeZone, with dates for start and end (grain: day).
	Day      bool
	TimeZone string
	// Inclusive: the end is the last day (Day) or microsecond of validity.
	Inclusive bool
	// CurrentEnd replaces NULL in the end of current versions ("" keeps NULL).
	CurrentEnd string
	// HideDeleted leaves out the versions marked deleted (deletes:
	// new_record); shown, they carry scd_deleted.
	HideDeleted bool
}

// viewSQL renders CREATE OR REPLACE VIEW for v over the history table
// schema.target with source columns cols. The bookkeeping columns come
// first, so a source column added later extends the view at its end, as
// CREATE OR REPLACE VIEW allows.
func viewSQL(schema, target string, v ViewSpec, cols []string) string {
	name := func(c string) string {
		if to, ok := v.Columns[c]; ok {
			return pgx.Identifier{to}.Sanitize()
		}
		return pgx.Identifier{c}.Sanitize()
	}
	tz := QuoteLiteral(v.TimeZone)
	start, end, kind := "valid_from", "valid_to", "timestamptz"
	if v.Day {
		start = fmt.Sprintf("(valid_from AT TIME ZONE %s)::date", tz)
		end = fmt.Sprintf("(valid_to AT TIME ZONE %s)::date", tz)
		kind = "date"
	}
	switch {
	case v.Inclusive && v.Day:
		end = "(" + end + " - 1)"
	case v.Inclusive:
		end = "(valid_to - interval '1 microsecond')"
	}
	current := "NULL::" + kind
	if v.CurrentEnd != "" {
		current = QuoteLiteral(v.CurrentEnd) + "::" + kind
	}
	sel := []string{
		"scd_id AS " + name("scd_id"),
		fmt.Sprintf("%s AS %s", start, name("valid_from")),
		fmt.Sprintf("CASE WHEN valid_to IS NULL THEN %s ELSE %s END AS %s", current, end, name("valid_to")),
		"is_current AS " + name("is_current"),
	}
	for _, c := range cols {
		sel = append(sel, fmt.Sprintf("%s AS %s", pgx.Identifier{c}.Sanitize(), name(c)))
	}
	var conds []string
	if v.Day { // the state at the end of each day: versions that lived past a midnight
		conds = append(conds, fmt.Sprintf("(valid_to IS NULL OR (valid_to AT TIME ZONE %[1]s)::date > (valid_from AT TIME ZONE %[1]s)::date)", tz))
	}
	if v.HideDeleted && slices.Contains(cols, "scd_deleted") {
		conds = append(conds, "NOT scd_deleted")
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	return fmt.Sprintf("CREATE OR REPLACE VIEW %s AS SELECT %s FROM %s%s", pgx.Identifier{schema, v.Name}.Sanitize(),
		strings.Join(sel, ", "), pgx.Identifier{schema, target}.Sanitize(), where)
}

// ViewStatements renders the DDL that (re)creates spec's views over the
// history table named target, reading its source columns from the
// catalog: rebuild runs it after swapping a rebuilt table in.
func ViewStatements(ctx context.Context, q Querier, spec TableSpec, target string) ([]string, error) {
	if len(spec.Views) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`,
		pgx.Identifier{spec.Schema, target}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("reading the columns of %s: %w", target, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading the columns of %s: %w", target, err)
	}
	var cols []string
	for _, n := range names {
		if !IsBookkeeping(n) {
			cols = append(cols, n)
		}
	}
	if slices.Contains(names, "scd_deleted") {
		cols = append(cols, "scd_deleted")
	}
	return viewsOver(ctx, q, spec, target, cols)
}

// viewsOver renders the DDL of spec's views over target's source columns
// cols. CREATE OR REPLACE VIEW keeps the columns a view has, in their
// order: a view that exists keeps its order (a rebuilt table may have met
// its source columns in another order than the live one), new columns
// come after.
func viewsOver(ctx context.Context, q Querier, spec TableSpec, target string, cols []string) ([]string, error) {
	var out []string
	for _, v := range spec.Views {
		rows, err := q.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum`,
			pgx.Identifier{spec.Schema, v.Name}.Sanitize())
		if err != nil {
			return nil, fmt.Errorf("reading the columns of view %s: %w", v.Name, err)
		}
		had, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("reading the columns of view %s: %w", v.Name, err)
		}
		out = append(out, viewSQL(spec.Schema, target, v, orderLike(had, cols, v)))
	}
	return out, nil
}

// orderLike orders the source columns cols as the view v's existing
// columns had (its output names) and the rest after them, in cols' order.
func orderLike(had, cols []string, v ViewSpec) []string {
	src := map[string]string{} // output name → source column
	for _, c := range cols {
		if to, ok := v.Columns[c]; ok {
			src[to] = c
		} else {
			src[c] = c
		}
	}
	var out []string
	seen := map[string]bool{}
	for _, h := range had {
		if c, ok := src[h]; ok && !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	for _, c := range cols {
		if !seen[c] {
			out = append(out, c)
		}
	}
	return out
}

// ViewStatements renders the DDL of t's views from the columns it knows,
// each in the order its view has now.
func (t *Table) ViewStatements(ctx context.Context, q Querier) ([]string, error) {
	var cols []string
	for _, c := range t.Cols {
		cols = append(cols, c.Name)
	}
	if t.DeletedCol {
		// Among the source columns, so that the view keeps its place as
		// columns come (CREATE OR REPLACE VIEW only appends).
		cols = append(cols, "scd_deleted")
	}
	return viewsOver(ctx, q, t.Spec, t.Spec.Target, cols)
}
