package catalog

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// With history_constraint: no_overlap the history table carries an
// exclusion constraint PostgreSQL enforces: no two versions of one key
// overlap in [valid_from, valid_to). It is a GiST exclusion over the key
// columns (equality, from the btree_gist extension, which an
// administrator creates) and tstzrange(valid_from, valid_to, '[)')
// (overlap); a zero-length version is an empty range and overlaps
// nothing. It is DEFERRABLE INITIALLY DEFERRED: a repair closes and opens
// versions in any order within the service's transaction, and the
// constraint is checked at its commit. PostgreSQL cannot enforce it
// across the partitions of a partitioned table (the configuration refuses
// the two together).

// ExclusionSuffix names a history table's no-overlap constraint (and its
// index): <target>_scd_excl.
const ExclusionSuffix = "_scd_excl"

// ConstraintError is what keeps the no-overlap constraint from being
// added: the btree_gist extension missing, versions that overlap already,
// a key type GiST cannot compare. The table waits for a fix (the sink
// classifies it as blocked): it is never half added.
type ConstraintError struct {
	Table string
	Msg   string
}

func (e *ConstraintError) Error() string {
	return fmt.Sprintf("history_constraint: no_overlap on %s: %s", e.Table, e.Msg)
}

// ensureNoOverlap adds the constraint to t's history table when it is
// missing: after checking that btree_gist is there and that no versions
// overlap already (listing the first ones found).
func ensureNoOverlap(ctx context.Context, pool *pgxpool.Pool, t *Table) error {
	name := NamesOf(t.Spec.Target).Exclusion
	hist := t.Hist.Sanitize()
	var has, gist bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2 AND contype = 'x'),
		EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'btree_gist')`, hist, name).Scan(&has, &gist); err != nil {
		return fmt.Errorf("reading the constraints of %s: %w", hist, err)
	}
	if has {
		return nil
	}
	if !gist {
		return &ConstraintError{Table: hist, Msg: "it needs the btree_gist extension: an administrator runs CREATE EXTENSION btree_gist; in this database " +
			"(docs/operations.md, Least privilege); the table waits until then"}
	}
	keys := QuoteIdents(t.Spec.Keys)
	overlaps, err := findOverlaps(ctx, pool, hist, keys, 5)
	if err != nil {
		return err
	}
	if len(overlaps) > 0 {
		return &ConstraintError{Table: hist, Msg: fmt.Sprintf("versions overlap already, so it cannot be added (scd2sink verify lists them all): %s",
			strings.Join(overlaps, "; "))}
	}
	var excl []string
	for _, k := range t.Spec.Keys {
		excl = append(excl, pgx.Identifier{k}.Sanitize()+" WITH =")
	}
	excl = append(excl, "tstzrange(valid_from, valid_to, '[)') WITH &&")
	err = InDDLTx(ctx, pool, "scd2sink table "+hist, []string{fmt.Sprintf(
		`ALTER TABLE %s ADD CONSTRAINT %s EXCLUDE USING gist (%s) DEFERRABLE INITIALLY DEFERRED`,
		hist, pgx.Identifier{name}.Sanitize(), strings.Join(excl, ", "))})
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42704":
		// A key column's type has no GiST operator class (jsonb, arrays).
		return &ConstraintError{Table: hist, Msg: "a key column's type cannot be compared by GiST: " + pgErr.Message}
	case err != nil:
		return fmt.Errorf("adding the no-overlap constraint to %s: %w", hist, err)
	}
	return nil
}

// findOverlaps lists up to limit versions that overlap the next version
// of their key (by valid_from), as verify does; zero-length versions
// overlap nothing.
func findOverlaps(ctx context.Context, pool *pgxpool.Pool, hist, keys string, limit int) ([]string, error) {
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT format('key %%s: scd_id %%s [%%s, %%s) overlaps scd_id %%s from %%s', k, scd_id, valid_from, coalesce(valid_to::text, 'open'), next_id, next_from)
		FROM (SELECT json_build_array(%s)::text AS k, scd_id, valid_from, valid_to,
		        lead(scd_id) OVER w AS next_id, lead(valid_from) OVER w AS next_from
		      FROM %s WHERE valid_to IS NULL OR valid_to > valid_from
		      WINDOW w AS (PARTITION BY %s ORDER BY valid_from, scd_seq)) v
		WHERE next_id IS NOT NULL AND (valid_to IS NULL OR valid_to > next_from) LIMIT %d`, keys, hist, keys, limit))
	if err != nil {
		return nil, fmt.Errorf("looking for overlapping versions in %s: %w", hist, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("looking for overlapping versions in %s: %w", hist, err)
	}
	return out, nil
}
