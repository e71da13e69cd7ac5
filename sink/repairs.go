package sink

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
)

// repairNote is a late repair to record in <target>_scd_repairs: the key
// and the sequence of the late event that caused it.
type repairNote struct {
	key   []any
	cause change.Seq
}

// repairCause is the sequence of the earliest of a repair's new events;
// for a repair forced by a truncate, the latest truncate's.
func repairCause(fresh []fevent, truncs []fevent) change.Seq {
	var cause change.Seq
	for _, e := range fresh {
		if cause == nil || e.seq.Compare(cause) < 0 {
			cause = e.seq
		}
	}
	if cause == nil && len(truncs) > 0 {
		cause = truncs[len(truncs)-1].seq
	}
	return cause
}

// versionsJSON renders the versions of the key x.k0.. of history table h
// as a JSON array of row objects, oldest first, without the scd_ columns
// that hold the sink's internal encodings.
func (t *table) versionsJSON(h, x string) string {
	return fmt.Sprintf(`coalesce((SELECT jsonb_agg(to_jsonb(%[1]s) - 'scd_seq' - 'scd_close_seq' - 'scd_hash' - 'scd_unavailable' ORDER BY %[1]s.scd_seq)
		FROM %[2]s %[1]s WHERE %[3]s), '[]'::jsonb)`, h, t.hist.Sanitize(), t.keyMatch(h, x))
}

// keyObject renders the key x.k0.. as a JSON object of the key columns.
func (t *table) keyObject(x string) string {
	parts := make([]string, len(t.keyIdx))
	for i, k := range t.keyNames() {
		parts[i] = fmt.Sprintf("%s, %s.k%d", quoteLiteral(k), x, i)
	}
	return "jsonb_build_object(" + strings.Join(parts, ", ") + ")"
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// recordRepairsBefore writes one audit row per repaired key with the key's
// versions as they are before the batch's writes; it returns the rows' ids.
func (w *writes) recordRepairsBefore(ctx context.Context, tx pgx.Tx, t *table) ([]int64, error) {
	if len(w.repairs) == 0 {
		return nil, nil
	}
	types, names, args := t.keySeqColumns(len(w.repairs),
		func(j int) []any { return w.repairs[j].key }, func(j int) []byte { return w.repairs[j].cause })
	q := fmt.Sprintf(`INSERT INTO %s (key, cause_seq, before) SELECT %s, x.seq, %s FROM %s RETURNING id`,
		t.repairs.Sanitize(), t.keyObject("x"), t.versionsJSON("h", "x"), unnest("x", 1, types, names))
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("recording repairs of %s: %w", t.hist.Sanitize(), err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("recording repairs of %s: %w", t.hist.Sanitize(), err)
	}
	return ids, nil
}

// recordRepairsAfter completes the audit rows with the keys' versions as
// the batch leaves them.
func (w *writes) recordRepairsAfter(ctx context.Context, tx pgx.Tx, t *table, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	types, names := append([]string{"bigint"}, t.keyTypes()...), append([]string{"id"}, genericNames("k", len(t.keyIdx))...)
	args := []any{ids}
	for i := range t.keyIdx {
		args = append(args, column(len(w.repairs), func(j int) any { return w.repairs[j].key[i] }))
	}
	q := fmt.Sprintf(`UPDATE %s r SET after = %s FROM %s WHERE r.id = x.id`,
		t.repairs.Sanitize(), t.versionsJSON("h", "x"), unnest("x", 1, types, names))
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return fmt.Errorf("recording repairs of %s: %w", t.hist.Sanitize(), err)
	}
	return nil
}
