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

// AutoAddBelow is the size (PostgreSQL's estimate of its rows) under
// which the service adds the constraint to a table that exists by itself:
// ALTER TABLE … ADD CONSTRAINT holds an ACCESS EXCLUSIVE lock while it
// builds the GiST index, a few seconds per hundred thousand versions, and
// readers wait that long. A bigger table waits for an operator to add it
// in a quiet hour (the error gives the statement) or for a rebuild.
const AutoAddBelow = 1_000_000

// ensureNoOverlap adds the constraint to t's history table when it is
// missing: after checking that btree_gist is there and that no versions
// overlap already (listing the first ones found).
func ensureNoOverlap(ctx context.Context, pool *pgxpool.Pool, t *Table) error {
	name := NamesOf(t.Spec.Target).Exclusion
	hist := t.Hist.Sanitize()
	var has, gist bool
	var rows float64
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2 AND contype = 'x'),
		EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'btree_gist'),
		coalesce((SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)), 0)`, hist, name).Scan(&has, &gist, &rows); err != nil {
		return fmt.Errorf("reading the constraints of %s: %w", hist, err)
	}
	if has {
		return nil
	}
	if t.Parts != nil {
		return &ConstraintError{Table: hist, Msg: "the table is partitioned, and PostgreSQL's exclusion constraints do not span partitions: drop history_constraint, or rebuild it unpartitioned"}
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
	add := fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT %s EXCLUDE USING gist (%s) DEFERRABLE INITIALLY DEFERRED`,
		hist, pgx.Identifier{name}.Sanitize(), strings.Join(excl, ", "))
	if rows >= AutoAddBelow {
		return &ConstraintError{Table: hist, Msg: fmt.Sprintf("the table holds about %.0f versions: adding the constraint locks it while its index "+
			"is built, so it is not done by itself; run in a quiet hour, as the service's role: %s", rows, add)}
	}
	err = InDDLTx(ctx, pool, "scd2sink table "+hist, []string{add})
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (pgErr.Code == "42P07" || pgErr.Code == "42710"):
		return nil // another instance added it meanwhile
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
		WHERE next_id IS NOT NULL AND (valid_to IS NULL OR valid_to > next_from)
		UNION ALL
		SELECT format('key %%s: scd_id %%s ends before it starts [%%s, %%s)', json_build_array(%s)::text, scd_id, valid_from, valid_to)
		FROM %s WHERE valid_to < valid_from OR valid_from IS NULL
		LIMIT %d`, keys, hist, keys, keys, hist, limit))
	if err != nil {
		return nil, fmt.Errorf("looking for overlapping versions in %s: %w", hist, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("looking for overlapping versions in %s: %w", hist, err)
	}
	return out, nil
}

// CheckNoOverlap checks t's deferred no-overlap constraint now, within
// tx: a refusal is then the statement's, the table's alone, instead of
// the whole batch's at COMMIT. The constraint stays immediate for the
// rest of tx (the table is not written again in it).
func CheckNoOverlap(ctx context.Context, tx pgx.Tx, t *Table) error {
	if _, err := tx.Exec(ctx, "SET CONSTRAINTS "+pgx.Identifier{t.Spec.Schema, NamesOf(t.Spec.Target).Exclusion}.Sanitize()+" IMMEDIATE"); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42704" {
			return nil // not there (yet): nothing to check
		}
		return fmt.Errorf("checking that no versions overlap: %w", err)
	}
	return nil
}

// OverlapRefused reports whether err is the no-overlap constraint
// refusing versions: never an event's fault, so never a dead letter.
func OverlapRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23P01" && strings.HasSuffix(pgErr.ConstraintName, ExclusionSuffix)
}
