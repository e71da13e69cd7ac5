package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/sink"
)

// HistoryQuery names one key of one table, and optionally a moment.
type HistoryQuery struct {
	// Table is a configured target, or the topic feeding it.
	Table string
	// Key holds the key values, in the order of the table's key columns,
	// as text.
	Key []string
	// At, when set, asks for the version valid then (any text PostgreSQL
	// reads as a timestamptz).
	At string
}

// ErrNoVersions is returned by History when the key has no version (at
// the moment asked for).
var ErrNoVersions = errors.New("no versions")

// History prints a key's versions as an aligned table, oldest first: the
// source columns, then valid_from, valid_to (empty while current) and
// is_current; with At only the version valid at At. Times are in UTC.
func History(ctx context.Context, cfg *config.Config, q HistoryQuery, out io.Writer) error {
	pool, err := Pool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	tables, err := resolvedTables(ctx, pool, cfg, config.NewRouter(cfg))
	if err != nil {
		return err
	}
	target := ""
	for _, t := range tables {
		if t.Target == q.Table || t.Topic == q.Table {
			target = t.Target
		}
	}
	if target == "" {
		var names []string
		for _, t := range tables {
			names = append(names, t.Target)
		}
		return &config.Error{Key: "--table", Msg: fmt.Sprintf("%q is neither a target nor a topic of the configuration (targets: %s)", q.Table, strings.Join(names, ", "))}
	}
	schema := cfg.Postgres.Schema
	hist := pgx.Identifier{schema, target}.Sanitize()
	if ok, err := tableExists(ctx, pool, schema, target); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("%s: no such table in schema %s yet: the service creates it at the table's first event (is postgres.schema right?)", target, schema)
	}
	keys, err := sink.KeyColumns(ctx, pool, schema, target)
	if err != nil {
		return err
	}
	if len(keys) == 0 {
		return fmt.Errorf("%s does not exist yet (or is not a history table scd2sink created)", hist)
	}
	if len(q.Key) != len(keys) {
		return &config.Error{Key: "--key", Msg: fmt.Sprintf("%s has %d key columns (%s), %d values given", target, len(keys), strings.Join(keys, ", "), len(q.Key))}
	}
	rows, err := pool.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped
		AND attname NOT LIKE 'scd\_%' AND attname NOT IN ('valid_from', 'valid_to', 'is_current') ORDER BY attnum`, hist)
	if err != nil {
		return fmt.Errorf("reading the columns of %s: %w", hist, err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("reading the columns of %s: %w", hist, err)
	}
	var sel, where []string
	for _, c := range cols {
		sel = append(sel, fmt.Sprintf("coalesce(%s::text, 'NULL')", pgx.Identifier{c}.Sanitize()))
	}
	sel = append(sel, `to_char(valid_from AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')`,
		`coalesce(to_char(valid_to AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US'), '')`, `is_current::text`)
	args := []any{}
	for i, k := range keys {
		args = append(args, q.Key[i])
		where = append(where, fmt.Sprintf("%s::text = $%d", pgx.Identifier{k}.Sanitize(), len(args)))
	}
	if q.At != "" {
		args = append(args, q.At)
		n := len(args)
		where = append(where, fmt.Sprintf("valid_from <= $%d::timestamptz AND (valid_to IS NULL OR $%d::timestamptz < valid_to)", n, n))
	}
	rows, err = pool.Query(ctx, fmt.Sprintf("SELECT %s FROM %s WHERE %s ORDER BY scd_seq", strings.Join(sel, ", "), hist, strings.Join(where, " AND ")), args...)
	if err != nil {
		return fmt.Errorf("reading the history of %s: %w", hist, err)
	}
	lines, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		vals := make([]string, len(cols)+3)
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := r.Scan(ptrs...); err != nil {
			return "", err
		}
		return strings.Join(vals, "\t"), nil
	})
	if err != nil {
		return fmt.Errorf("reading the history of %s: %w", hist, err)
	}
	if len(lines) == 0 {
		return ErrNoVersions
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(append(cols, "valid_from (UTC)", "valid_to (UTC)", "is_current"), "\t"))
	for _, l := range lines {
		fmt.Fprintln(tw, l)
	}
	return tw.Flush()
}
