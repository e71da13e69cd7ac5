package history

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// RepairNote is a late repair to record in <target>_scd_repairs: the key,
// the sequence of the late event that caused it, and the opening
// sequences of the versions it inserted, changed or deleted (at most
// maxAudited of them, the earliest; omitted counts the others).
type RepairNote struct {
	Key     []any
	Cause   change.Seq
	touched [][]byte
	omitted int
	// Below, when set, says that every version under it, not read by the
	// repair, gets the key's new Type 1 values (all_versions): they are
	// touched too, and come first.
	Below change.Seq
}

// maxAudited bounds the versions an audit row holds on each side, so that
// a repair of a key with a long history (a late Type 1 change spreads to
// every version) stays small: 1,000 versions of a few hundred bytes.
const maxAudited = 1000

// NoteTouched sets the versions a repair changed, earliest first.
func (n *RepairNote) NoteTouched(seqs []change.Seq) {
	slices.SortFunc(seqs, func(a, b change.Seq) int { return a.Compare(b) })
	if len(seqs) > maxAudited {
		n.omitted = len(seqs) - maxAudited
		seqs = seqs[:maxAudited]
	}
	for _, sq := range seqs {
		n.touched = append(n.touched, sq)
	}
}

// RepairCause is the sequence of the earliest of a repair's new events;
// for a repair forced by a truncate, the latest truncate's.
func RepairCause(fresh []fold.Event, truncs []fold.Event) change.Seq {
	var cause change.Seq
	for _, e := range fresh {
		if cause == nil || e.Seq.Compare(cause) < 0 {
			cause = e.Seq
		}
	}
	if cause == nil && len(truncs) > 0 {
		cause = truncs[len(truncs)-1].Seq
	}
	return cause
}

// fillVersions sets column col (before or after) of the audit rows ids
// (one per repair, in order) to the versions each repair touched, as they
// are now: a JSON array of row objects, oldest first, without the scd_
// columns that hold the sink's internal encodings. The touched versions
// are passed flat, each with its row's id and key, and found through the
// key index: linear in their number.
func (w *Writes) fillVersions(ctx context.Context, tx pgx.Tx, t *plan.Table, ids []int64, col string) error {
	var n int
	for _, r := range w.Repairs {
		n += len(r.touched)
	}
	if n == 0 {
		return nil
	}
	rid, keys, seqs := make([]int64, 0, n), make([][]any, 0, n), make([][]byte, 0, n)
	for i, r := range w.Repairs {
		for _, sq := range r.touched {
			rid, keys, seqs = append(rid, ids[i]), append(keys, r.Key), append(seqs, sq)
		}
	}
	types, names, args := keySeqColumns(t, n, func(j int) []any { return keys[j] }, func(j int) []byte { return seqs[j] }, &w.mem.Boxes)
	types, names, args = append(types, "bigint"), append(names, "id"), append(args, rid)
	q := fmt.Sprintf(`UPDATE %[1]s r SET %[2]s = a.arr FROM (
			SELECT x.id, jsonb_agg(to_jsonb(h) - 'scd_seq' - 'scd_close_seq' - 'scd_hash' - 'scd_unavailable' - 'scd_absent' - 'scd_raw_t' - 'scd_attnum' ORDER BY h.scd_seq) AS arr
			FROM %[3]s JOIN %[4]s h ON %[5]s AND h.scd_seq = x.seq GROUP BY x.id) a
		WHERE r.id = a.id`, t.Repairs.Sanitize(), col, unnest("x", 1, types, names), t.Hist.Sanitize(), keyMatch(t, "h", "x"))
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return fmt.Errorf("recording repairs of %s: %w", t.Hist.Sanitize(), err)
	}
	return nil
}

// keyObject renders the key x.k0.. as a JSON object of the key columns,
// whose names are bound as parameter param (a text[] of t.keyNames()):
// a column name, which comes from events, is never pasted into SQL.
func keyObject(t *plan.Table, x string, param int) string {
	parts := make([]string, len(t.KeyIdx))
	for i := range t.KeyIdx {
		parts[i] = fmt.Sprintf("($%d::text[])[%d], %s.k%d", param, i+1, x, i)
	}
	return "jsonb_build_object(" + strings.Join(parts, ", ") + ")"
}

// recordRepairsBefore writes one audit row per repaired key with the
// versions the repair touches as they are before the batch's writes; it
// returns the rows' ids.
func (w *Writes) recordRepairsBefore(ctx context.Context, tx pgx.Tx, t *plan.Table) ([]int64, error) {
	if len(w.Repairs) == 0 {
		return nil, nil
	}
	if err := w.noteBelow(ctx, tx, t); err != nil {
		return nil, err
	}
	types, names, args := keySeqColumns(t, len(w.Repairs),
		func(j int) []any { return w.Repairs[j].Key }, func(j int) []byte { return w.Repairs[j].Cause }, &w.mem.Boxes)
	types, names = append(types, "int", "int"), append(names, "ord", "omitted")
	args = append(args, column(len(w.Repairs), func(j int) int32 { return int32(j) }),
		column(len(w.Repairs), func(j int) int32 { return int32(w.Repairs[j].omitted) }), t.KeyNames())
	q := fmt.Sprintf(`INSERT INTO %s (key, cause_seq, omitted, before, after)
		SELECT %s, x.seq, x.omitted, '[]', '[]' FROM %s ORDER BY x.ord RETURNING id`,
		t.Repairs.Sanitize(), keyObject(t, "x", len(args)), unnest("x", 1, types, names))
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("recording repairs of %s: %w", t.Hist.Sanitize(), err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("recording repairs of %s: %w", t.Hist.Sanitize(), err)
	}
	if len(ids) != len(w.Repairs) {
		return nil, fmt.Errorf("recording repairs of %s: %d rows for %d repairs", t.Hist.Sanitize(), len(ids), len(w.Repairs))
	}
	return ids, w.fillVersions(ctx, tx, t, ids, "before")
}

// recordRepairsAfter completes the audit rows with the touched versions as
// the batch leaves them.
func (w *Writes) recordRepairsAfter(ctx context.Context, tx pgx.Tx, t *plan.Table, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	return w.fillVersions(ctx, tx, t, ids, "after")
}

// noteBelow adds to the repairs with below set the versions under it
// (all_versions' Type 1 values given to the versions a repair did not
// read), earliest first, within maxAudited.
func (w *Writes) noteBelow(ctx context.Context, tx pgx.Tx, t *plan.Table) error {
	for i := range w.Repairs {
		r := &w.Repairs[i]
		if r.Below == nil {
			continue
		}
		conds, args := make([]string, len(t.KeyIdx)), make([]any, 0, len(t.KeyIdx)+2)
		for j, ki := range t.KeyIdx {
			conds[j] = fmt.Sprintf("%s = $%d::%s", pgx.Identifier{t.Cols[ki].Name}.Sanitize(), j+1, t.Cols[ki].Cast())
			args = append(args, r.Key[j])
		}
		args = append(args, []byte(r.Below), maxAudited)
		rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT scd_seq, count(*) OVER () FROM %s WHERE %s AND scd_seq < $%d ORDER BY scd_seq LIMIT $%d`,
			t.Hist.Sanitize(), strings.Join(conds, " AND "), len(t.KeyIdx)+1, len(t.KeyIdx)+2), args...)
		if err != nil {
			return fmt.Errorf("recording repairs of %s: %w", t.Hist.Sanitize(), err)
		}
		var under [][]byte
		total := 0
		for rows.Next() {
			var sq []byte
			if err := rows.Scan(&sq, &total); err != nil {
				rows.Close()
				return err
			}
			under = append(under, sq)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("recording repairs of %s: %w", t.Hist.Sanitize(), err)
		}
		all := len(r.touched) + r.omitted + total
		r.touched = append(under, r.touched...)
		if len(r.touched) > maxAudited {
			r.touched = r.touched[:maxAudited]
		}
		r.omitted = all - len(r.touched)
	}
	return nil
}
