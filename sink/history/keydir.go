package history

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// The key directory of a partitioned table (catalog: partDir) holds a
// row for every key whose latest version is closed. Every write that
// leaves a key's latest version closed goes through writes: the append
// path (appendKey) and the repair path (repairKey, truncates included)
// note the key here, and execWrites upserts the rows in the batch's
// transaction, so the directory commits and rolls back with the versions.
// A key re-opened later keeps its row (the directory is a superset);
// erase deletes it with the key's other rows.

// dirRow is a key whose latest version a batch left closed at to.
type dirRow struct {
	key []any
	to  time.Time
}

// NoteClosedLatest notes, for a partitioned table, that the key's latest
// version v (nil: none) is closed.
func (w *Writes) NoteClosedLatest(t *plan.Table, key []any, v *fold.Version) {
	if w == nil || t.Parts == nil || v == nil || !v.Closed {
		return
	}
	w.dir = append(w.dir, dirRow{key: key, to: v.To})
}

// writeDir upserts w's directory rows (the last one noted of a key wins).
func (w *Writes) writeDir(ctx context.Context, tx pgx.Tx, t *plan.Table) error {
	if t.Parts == nil || len(w.dir) == 0 {
		return nil
	}
	rows := w.dir
	types, names := t.KeyTypes(), genericNames("k", len(t.KeyIdx))
	var args []any
	for i := range t.KeyIdx {
		args = append(args, column(len(rows), func(j int) any { return rows[j].key[i] }))
	}
	types, names = append(types, "timestamptz"), append(names, "t")
	args = append(args, column(len(rows), func(j int) time.Time { return rows[j].to }))
	keys := catalog.QuoteIdents(t.KeyNames())
	xk := strings.Join(prefixed("x.", names[:len(t.KeyIdx)]), ", ")
	// One row per key as PostgreSQL compares keys (the last noted wins):
	// an upsert may not touch a row twice.
	casts := make([]string, len(types))
	for i, typ := range types {
		casts[i] = fmt.Sprintf("$%d::%s[]", i+1, typ)
	}
	src := fmt.Sprintf("unnest(%s) WITH ORDINALITY AS x(%s, ord)", strings.Join(casts, ", "), strings.Join(names, ", "))
	q := fmt.Sprintf(`INSERT INTO %s AS d (%s, last_to) SELECT DISTINCT ON (%s) %s, x.t FROM %s ORDER BY %s, x.ord DESC
		ON CONFLICT (%s) DO UPDATE SET last_to = EXCLUDED.last_to WHERE d.last_to IS DISTINCT FROM EXCLUDED.last_to`,
		t.Parts.Dir().Sanitize(), keys, xk, xk, src, xk, keys)
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return fmt.Errorf("noting closed keys in %s: %w", t.Parts.Dir().Sanitize(), err)
	}
	return nil
}

func prefixed(p string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	return out
}

// readClosedLatest reads into out[i], for the keys keys[i] of idx (keys
// without a current version in a partitioned table), the latest closed
// version and the side-table summary, from the partitions of closed
// versions at or after the key's directory bound. A key without a
// directory row has no version and is not looked up (its ClosedFrom is
// fold.NoneClosed); a key whose bound
// finds nothing is returned in again, to be read from every partition.
func readClosedLatest(ctx context.Context, tx pgx.Tx, t *plan.Table, keys []*plan.KeyPlan, idx []int, out []fold.Latest) (again []int, err error) {
	sub := make([]*plan.KeyPlan, len(idx))
	for j, i := range idx {
		sub[j] = keys[i]
	}
	for _, i := range idx {
		out[i].ClosedFrom = fold.NoneClosed // unless the directory has it
	}
	src, args := keysSource(t, sub, 1)
	// (The bound is a parameter of the inner side of a nested loop: the
	// partitions ending at or before it are pruned at run time.)
	q := fmt.Sprintf(`SELECT k.scd_ord, %s, %s, s.scd_seq, s.scd_t,
			EXISTS (SELECT 1 FROM %s o WHERE %s AND o.scd_seq = h.scd_seq)
		FROM %s
		JOIN %s d ON %s
		LEFT JOIN LATERAL (SELECT * FROM %s x WHERE %s AND NOT x.is_current AND x.valid_to >= d.last_to ORDER BY x.scd_seq DESC LIMIT 1) h ON true
		LEFT JOIN LATERAL (SELECT e.scd_seq, e.scd_t FROM %s e WHERE %s ORDER BY e.scd_seq DESC LIMIT 1) s ON true`,
		versionCols, colList(t, "h."), t.Side.Sanitize(), t.KeyJoin("o", "k"), src,
		t.Parts.Dir().Sanitize(), t.KeyJoin("d", "k"),
		t.Hist.Sanitize(), t.KeyJoin("x", "k"),
		t.Side.Sanitize(), t.KeyJoin("e", "k"))
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("reading closed versions of %s: %w", t.Hist.Sanitize(), err)
	}
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		i := idx[vals[0].(int64)-1]
		out[i].ClosedFrom = time.Time{} // it has versions: unknown
		if vals[1] == nil {             // in the directory, not found from its bound
			again = append(again, i)
			continue
		}
		if err := latestFromRow(t, vals, &out[i]); err != nil {
			return nil, err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading closed versions of %s: %w", t.Hist.Sanitize(), err)
	}
	return again, nil
}
