package history

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// keysSource renders "unnest($1::t1[], ...) WITH ORDINALITY AS k(k1, ..., ord)"
// and its arguments for the given keys; rows come back numbered from 1.
func keysSource(t *plan.Table, keys []*plan.KeyPlan, firstParam int) (string, []any) {
	var casts []string
	args := make([]any, len(t.KeyIdx))
	for i, ki := range t.KeyIdx {
		col := make([]any, len(keys))
		for j, kp := range keys {
			col[j] = kp.Key[i]
		}
		args[i] = col
		casts = append(casts, fmt.Sprintf("$%d::%s[]", firstParam+i, t.Cols[ki].Cast()))
	}
	names := catalog.QuoteIdents(t.KeyNames())
	return fmt.Sprintf("unnest(%s) WITH ORDINALITY AS k(%s, scd_ord)", strings.Join(casts, ", "), names), args
}

// colList lists t's columns as LoadLatest and RowBefore read them,
// each prefixed by prefix.
func colList(t *plan.Table, prefix string) string {
	parts := make([]string, len(t.Cols))
	for i, c := range t.Cols {
		parts[i] = prefix + pgx.Identifier{c.Name}.Sanitize()
	}
	return strings.Join(parts, ", ")
}

const versionCols = "h.scd_id, h.scd_seq, h.scd_op, h.scd_hash, h.valid_from, h.valid_to, h.scd_close_seq, h.scd_unavailable, h.scd_absent, h.scd_raw_t, h.scd_attnum"

// rowAt is where the source columns start in a row read with versionCols
// after the key ordinal.
const rowAt = 12

func scanVersion(t *plan.Table, vals []any, off int) (*fold.Version, error) {
	v := &fold.Version{Stored: true}
	var ok bool
	if v.ID, ok = vals[off].(int64); !ok {
		return nil, fmt.Errorf("scd_id is %T", vals[off])
	}
	v.Seq = change.Seq(asBytes(vals[off+1]))
	op, _ := vals[off+2].(string)
	if op == "" {
		op = "u"
	}
	v.Op = change.Op(op[0])
	v.Hash = asBytes(vals[off+3])
	v.From, _ = vals[off+4].(time.Time)
	if to, isTime := vals[off+5].(time.Time); isTime {
		v.To, v.Closed = to, true
	}
	if cs := asBytes(vals[off+6]); cs != nil {
		v.CloseSeq = change.Seq(cs)
	}
	v.Unavail = asStrings(vals[off+7])
	v.Absent = unknown(t, asStrings(vals[off+8]), vals[off+10])
	v.Complete = vals[off+10] == nil
	v.OpenAbsent = v.Absent
	v.Raw, _ = vals[off+9].(time.Time)
	return v, nil
}

// unknown adds to absent the non-key columns added to the table after a
// row was written (attnum above the row's scd_attnum; NULL in rows from
// before scd_attnum, taken as knowing every column).
func unknown(t *plan.Table, absent []string, rowAttnum any) []string {
	n, ok := rowAttnum.(int16)
	if !ok || n >= t.Attnum {
		return absent
	}
	for _, c := range t.Cols {
		if c.Attnum > n && !c.Key && !slices.Contains(absent, c.Name) {
			absent = append(absent, c.Name)
		}
	}
	return absent
}

func asStrings(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func asBytes(v any) []byte {
	b, _ := v.([]byte)
	return b
}

// LoadLatest reads, for each key, its latest version and side-table
// summary. pre holds what the batch's prefetch (Prefetch) read of some
// keys in its first read: those are not read again.
func LoadLatest(ctx context.Context, tx pgx.Tx, t *plan.Table, keys []*plan.KeyPlan, pre map[*plan.KeyPlan]*fold.Latest) ([]fold.Latest, error) {
	out := make([]fold.Latest, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	all := make([]int, len(keys))
	var first []int // the keys the prefetch did not read
	for i, kp := range keys {
		all[i] = i
		if l, ok := pre[kp]; ok {
			out[i] = *l
		} else {
			first = append(first, i)
		}
	}
	// Partitioned: a key's current version, when it has one, is its
	// latest (the fold opens versions in sequence order and only the last
	// is open), and lives in _pcur. Only the keys without one and with a
	// row in the key directory (keydir.go) have versions to look for
	// among the closed ones, from the directory's bound on; those it does
	// not find there, in every partition.
	if len(first) > 0 {
		if err := readLatest(ctx, tx, t, keys, first, out, t.Parts != nil); err != nil {
			return nil, err
		}
	}
	pending := all
	if t.Parts != nil {
		if pending = withoutVersion(out, all); len(pending) > 0 {
			again, err := readClosedLatest(ctx, tx, t, keys, pending, out)
			if err != nil {
				return nil, err
			}
			if len(again) > 0 {
				if err := readLatest(ctx, tx, t, keys, again, out, false); err != nil {
					return nil, err
				}
			}
		}
	}
	// Keys with only side rows (say, deletes of never-seen rows), unless
	// their side rows were read with their (absent) version.
	var idx []int
	for _, i := range withoutVersion(out, pending) {
		if !out[i].SideRead {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return out, nil
	}
	missing := make([]*plan.KeyPlan, len(idx))
	for j, i := range idx {
		missing[j] = keys[i]
	}
	src, args := keysSource(t, missing, 1)
	q := fmt.Sprintf(`SELECT k.scd_ord, s.scd_seq, s.scd_t FROM %s
		JOIN LATERAL (SELECT e.scd_seq, e.scd_t FROM %s e WHERE %s ORDER BY e.scd_seq DESC LIMIT 1) s ON true`,
		src, t.Side.Sanitize(), t.KeyJoin("e", "k"))
	rows2, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("reading side rows of %s: %w", t.Hist.Sanitize(), err)
	}
	defer rows2.Close()
	for rows2.Next() {
		var ord int64
		var seq []byte
		var mt time.Time
		if err := rows2.Scan(&ord, &seq, &mt); err != nil {
			return nil, err
		}
		l := &out[idx[ord-1]]
		l.SideMaxSeq, l.SideMaxT = seq, &mt
	}
	return out, rows2.Err()
}

// withoutVersion returns the indexes among idx whose out has no version.
func withoutVersion(out []fold.Latest, idx []int) []int {
	var rest []int
	for _, i := range idx {
		if out[i].V == nil {
			rest = append(rest, i)
		}
	}
	return rest
}

// readLatest reads into out[i], for the keys keys[i] of idx, the latest
// version (onlyCurrent: the current one) and the side-table summary.
func readLatest(ctx context.Context, tx pgx.Tx, t *plan.Table, keys []*plan.KeyPlan, idx []int, out []fold.Latest, onlyCurrent bool) error {
	q, args := latestQuery(t, keys, idx, onlyCurrent)
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("reading current versions of %s: %w", t.Hist.Sanitize(), err)
	}
	defer rows.Close()
	return scanLatest(t, rows, idx, out)
}

// latestQuery is readLatest's statement.
func latestQuery(t *plan.Table, keys []*plan.KeyPlan, idx []int, onlyCurrent bool) (string, []any) {
	sub := make([]*plan.KeyPlan, len(idx))
	for j, i := range idx {
		sub[j] = keys[i]
	}
	src, args := keysSource(t, sub, 1)
	cur := ""
	if onlyCurrent {
		cur = " AND x.is_current"
	}
	// Clamped times grow with the sequence, so the side row with the highest
	// sequence also has the latest time. A key without a version has a
	// row too (NULL version columns), with its side rows' summary: a new
	// key costs no second statement (LoadLatest).
	q := fmt.Sprintf(`SELECT k.scd_ord, %s, %s, s.scd_seq, s.scd_t,
			EXISTS (SELECT 1 FROM %s o WHERE %s AND o.scd_seq = h.scd_seq)
		FROM %s
		LEFT JOIN LATERAL (SELECT * FROM %s x WHERE %s%s ORDER BY x.scd_seq DESC LIMIT 1) h ON true
		LEFT JOIN LATERAL (SELECT e.scd_seq, e.scd_t FROM %s e WHERE %s ORDER BY e.scd_seq DESC LIMIT 1) s ON true`,
		versionCols, colList(t, "h."), t.Side.Sanitize(), t.KeyJoin("o", "k"), src, t.Hist.Sanitize(), t.KeyJoin("x", "k"), cur,
		t.Side.Sanitize(), t.KeyJoin("e", "k"))
	return q, args
}

// scanLatest reads latestQuery's rows into out (see readLatest).
func scanLatest(t *plan.Table, rows pgx.Rows, idx []int, out []fold.Latest) error {
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return err
		}
		if err := latestFromRow(t, vals, &out[idx[vals[0].(int64)-1]]); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading current versions of %s: %w", t.Hist.Sanitize(), err)
	}
	return nil
}

// latestFromRow sets l from a row of latestQuery (or readClosedLatest):
// the key's ordinal, its version (NULL columns: none), the side-table
// summary and whether the version's opener is saved.
func latestFromRow(t *plan.Table, vals []any, l *fold.Latest) error {
	n := len(t.Cols)
	l.SideRead = true
	if vals[1] == nil { // no version (latestQuery's LEFT JOIN)
		l.V = nil
		if s := asBytes(vals[rowAt+n]); s != nil {
			l.SideMaxSeq = change.Seq(s)
		}
		if mt, ok := vals[rowAt+1+n].(time.Time); ok {
			l.SideMaxT = &mt
		}
		return nil
	}
	v, err := scanVersion(t, vals, 1)
	if err != nil {
		return err
	}
	v.Row = vals[rowAt : rowAt+n]
	t.NormalizeRow(v.Row)
	l.V = v
	if s := asBytes(vals[rowAt+n]); s != nil {
		l.SideMaxSeq = change.Seq(s)
	}
	if mt, ok := vals[rowAt+1+n].(time.Time); ok {
		l.SideMaxT = &mt
	}
	l.OpenerSaved, _ = vals[rowAt+2+n].(bool)
	return nil
}

// history is what the table holds for one key: everything, or (from set)
// its versions and side rows from sequence from on, and (until set) up to
// the version opened at until: a boundary the late events cannot move
// (see bound).
type KeyHistory struct {
	Versions []*fold.Version
	Side     []fold.Event
	From     change.Seq
	Until    change.Seq
	// Horizon is the sequence up to which retention removed the key's
	// history (its side row with scd_op 'h'), nil if it did not, or if
	// the history was read from after it.
	Horizon change.Seq
}

// Bound is what decides how far a key's late events can reach: the last
// one's sequence and the latest raw time among them. A version opened
// after last is a boundary when it was not clamped (scd_raw_t NULL) and
// opened at or after latest, so its time cannot move, and has no
// unavailable-value placeholders, so its row does not depend on the events
// before it (a version marked deleted never is one: its row is the closed
// version's): if the fold of the late events still opens it, everything from
// it on stays as stored (the key's last event, whose Type 1 values every
// version holds under all_versions, is past it too). Whether it still opens
// is known only after folding up to it: repairKey checks, and the history
// is read on to the end if not. Only the 64 versions after last are looked
// at (in index order: the conditions are not filters whose selectivity the
// planner would guess). No truncate may come after the first late
// event (whether it closes something may change, and with it the times
// after it).
type Bound struct {
	Last   change.Seq
	Latest time.Time
}

// Load reads every version and side row of the keys.
func Load(ctx context.Context, tx pgx.Tx, t *plan.Table, keys []*plan.KeyPlan) ([]KeyHistory, error) {
	return LoadFrom(ctx, tx, t, keys, nil, nil)
}

// LoadFrom reads the history of each key from the version before
// the latest one opened at or before after[i] (nil: all of it): what a
// late event at after[i] may change, and one version before it, whose
// resolved row is the fold's starting point (apply.go, repairKey); when
// that one is marked deleted (deletes: new_record), from the one before
// it. A key with fewer versions up to there (or, after retention, none
// before it but one marked deleted) is read whole.
//
// With bounds (one per key; a zero one for none), a key's history is read
// only up to its boundary version, when it has one (see bound).
func LoadFrom(ctx context.Context, tx pgx.Tx, t *plan.Table, keys []*plan.KeyPlan, after []change.Seq, bounds []Bound) ([]KeyHistory, error) {
	out := make([]KeyHistory, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	n := len(t.Cols)
	src, args := keysSource(t, keys, 1)
	if after != nil {
		from := make([][]byte, len(keys))
		lasts := make([][]byte, len(keys))
		latest := make([]any, len(keys))
		for i := range keys {
			from[i] = after[i]
			if bounds != nil && bounds[i].Last != nil {
				lasts[i], latest[i] = bounds[i].Last, bounds[i].Latest
			}
		}
		// (The start is never a version marked deleted: its opener, the
		// delete, has no image, and the placeholders after it resolve
		// against the last image before it, which the start's own row
		// or side rows give. Two versions marked deleted are never
		// adjacent (a delete opens one only while another version is
		// live), so the start is the second or the third of the latest
		// three: one backward index scan of three rows.)
		rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT k.scd_ord, (SELECT x.s FROM (SELECT h.scd_seq AS s, h.scd_op AS op FROM %[1]s h WHERE %[2]s
				AND h.scd_seq <= f.s ORDER BY h.scd_seq DESC OFFSET 1 LIMIT 2) x WHERE x.op <> 'd' ORDER BY x.s DESC LIMIT 1),
				(SELECT b.s FROM (SELECT h.scd_seq AS s, h.scd_raw_t IS NULL AND coalesce(cardinality(h.scd_unavailable), 0) = 0
					AND h.valid_from >= f.t AND h.scd_op <> 'd' AS ok FROM %[1]s h WHERE %[2]s AND h.scd_seq > f.l ORDER BY h.scd_seq LIMIT 64) b
					WHERE b.ok ORDER BY b.s LIMIT 1)
			FROM %[3]s JOIN unnest($%[4]d::bytea[], $%[5]d::bytea[], $%[6]d::timestamptz[]) WITH ORDINALITY AS f(s, l, t, ord) ON f.ord = k.scd_ord`,
			t.Hist.Sanitize(), t.KeyJoin("h", "k"), src, len(args)+1, len(args)+2, len(args)+3), append(args, from, lasts, latest)...)
		if err != nil {
			return nil, fmt.Errorf("reading where the history of %s is read from: %w", t.Hist.Sanitize(), err)
		}
		for rows.Next() {
			var ord int64
			var start, until []byte
			if err := rows.Scan(&ord, &start, &until); err != nil {
				rows.Close()
				return nil, err
			}
			if start != nil {
				out[ord-1].From = change.Seq(start)
			}
			if until != nil {
				out[ord-1].Until = change.Seq(until)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("reading where the history of %s is read from: %w", t.Hist.Sanitize(), err)
		}
	}
	// Whole histories (a truncate's re-fold, keys read from the start)
	// need no lower bound: the planner then reads each key's rows alone.
	histFrom, sideFrom := "", ""
	if after != nil {
		starts := make([][]byte, len(keys))
		untils := make([][]byte, len(keys))
		for i := range keys {
			starts[i], untils[i] = out[i].From, out[i].Until
		}
		src = fmt.Sprintf(`%s JOIN unnest($%d::bytea[], $%d::bytea[]) WITH ORDINALITY AS f(s, u, ord) ON f.ord = k.scd_ord`, src, len(args)+1, len(args)+2)
		args = append(args, starts, untils)
		// (Sequences start with a tag byte below 0xff: the upper bound
		// stays an index range when there is none.)
		histFrom = ` AND h.scd_seq >= coalesce(f.s, ''::bytea) AND h.scd_seq <= coalesce(f.u, decode('ff', 'hex'))`
		sideFrom = ` AND e.scd_seq >= coalesce(f.s, ''::bytea) AND e.scd_seq <= coalesce(f.u, decode('ff', 'hex'))`
	}
	// Per key, one index range scan of (key, scd_seq) between its bounds.
	q := fmt.Sprintf(`SELECT k.scd_ord, %s, %s FROM %s JOIN LATERAL (SELECT * FROM %s h WHERE %s%s) h ON true ORDER BY k.scd_ord, h.scd_seq`,
		versionCols, colList(t, "h."), src, t.Hist.Sanitize(), t.KeyJoin("h", "k"), histFrom)
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("reading history of %s: %w", t.Hist.Sanitize(), err)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			rows.Close()
			return nil, err
		}
		v, err := scanVersion(t, vals, 1)
		if err != nil {
			rows.Close()
			return nil, err
		}
		v.Row = vals[rowAt : rowAt+n]
		t.NormalizeRow(v.Row)
		h := &out[vals[0].(int64)-1]
		h.Versions = append(h.Versions, v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading history of %s: %w", t.Hist.Sanitize(), err)
	}
	q = fmt.Sprintf(`SELECT k.scd_ord, e.scd_seq, e.scd_op, e.scd_t, e.scd_hash, e.scd_unavailable, e.scd_absent, e.scd_raw_t, e.scd_attnum, %s FROM %s JOIN LATERAL (SELECT * FROM %s e WHERE %s%s) e ON true ORDER BY k.scd_ord, e.scd_seq`,
		colList(t, "e."), src, t.Side.Sanitize(), t.KeyJoin("e", "k"), sideFrom)
	rows, err = tx.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("reading side rows of %s: %w", t.Hist.Sanitize(), err)
	}
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		op, _ := vals[2].(string)
		if op == horizonOp {
			out[vals[0].(int64)-1].Horizon = change.Seq(asBytes(vals[1]))
			continue
		}
		if _, err := change.ParseOp(op); err != nil {
			return nil, &catalog.DriftError{Table: t.Side.Sanitize(), What: fmt.Sprintf("a side row holds scd_op %q, not an operation scd2sink writes", op)}
		}
		fe := fold.Event{Seq: change.Seq(asBytes(vals[1])), Op: change.Op(op[0]), Hash: asBytes(vals[4]), Unavail: asStrings(vals[5]), Absent: unknown(t, asStrings(vals[6]), vals[8]), Complete: vals[8] == nil}
		fe.T, _ = vals[3].(time.Time)
		fe.Raw, _ = vals[7].(time.Time)
		if fe.Op.HasAfter() {
			fe.Row = vals[9 : 9+n]
			t.NormalizeRow(fe.Row)
		}
		h := &out[vals[0].(int64)-1]
		h.Side = append(h.Side, fe)
	}
	return out, rows.Err()
}

// horizonOp is the scd_op of the side row where retention cut a key's
// history (see the sink's retention.go and package maint).
const horizonOp = "h"

// ReadPrevAbsent works out PrevAbsent (fold.Latest) for the states, read
// from the table, of the append path's keys (keys[i] has states[i]) whose
// first new after image holds placeholders (the later ones resolve
// against the batch's own images).
// The key's last after image is its latest side row with one when that
// comes after the last version with an image (the latest version, or for
// one marked deleted the last version before it that is not): the
// columns that row lacked, and those added to the table since it was
// written, were NULL in it. Otherwise the last image opened a version,
// whose row holds NULL for the columns it lacked: nothing to change. Keys
// without side rows after that version are not read; a batch without
// placeholders reads nothing.
func ReadPrevAbsent(ctx context.Context, tx pgx.Tx, t *plan.Table, keys []*plan.KeyPlan, states []*fold.Latest, evs map[*plan.KeyPlan][]fold.Event) error {
	var need []*plan.KeyPlan
	var at []int
	var after [][]byte // the latest version's sequence; nil: marked deleted
	for i, kp := range keys {
		l := states[i]
		if l.PrevKnown || l.V == nil {
			continue
		}
		placeholders := false
		for _, e := range evs[kp] {
			if e.Op.HasAfter() {
				placeholders = len(e.Unavail) > 0
				break
			}
		}
		if !placeholders {
			continue
		}
		l.PrevKnown = true
		if l.SideMaxSeq == nil || (!l.V.Deleted() && l.SideMaxSeq.Compare(l.V.Seq) < 0) {
			continue
		}
		var v []byte
		if !l.V.Deleted() {
			v = l.V.Seq
		}
		need, at, after = append(need, kp), append(at, i), append(after, v)
	}
	if len(need) == 0 {
		return nil
	}
	src, args := keysSource(t, need, 1)
	q := fmt.Sprintf(`SELECT k.scd_ord, s.scd_absent, s.scd_attnum
		FROM %[1]s JOIN unnest($%[2]d::bytea[]) WITH ORDINALITY AS f(v, ord) ON f.ord = k.scd_ord
		JOIN LATERAL (SELECT e.scd_absent, e.scd_attnum FROM %[3]s e WHERE %[4]s AND e.scd_op IN ('c', 'r', 'u')
			AND e.scd_seq > coalesce(f.v, (SELECT h.scd_seq FROM %[5]s h WHERE %[6]s AND h.scd_op <> 'd' ORDER BY h.scd_seq DESC LIMIT 1), ''::bytea)
			ORDER BY e.scd_seq DESC LIMIT 1) s ON true`,
		src, len(args)+1, t.Side.Sanitize(), t.KeyJoin("e", "k"), t.Hist.Sanitize(), t.KeyJoin("h", "k"))
	rows, err := tx.Query(ctx, q, append(args, after)...)
	if err != nil {
		return fmt.Errorf("reading the last images of %s: %w", t.Hist.Sanitize(), err)
	}
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return err
		}
		l := states[at[vals[0].(int64)-1]]
		l.PrevAbsent = unknown(t, asStrings(vals[1]), vals[2])
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading the last images of %s: %w", t.Hist.Sanitize(), err)
	}
	return nil
}

// RowBefore reads the row of key's last version in t before sequence seq
// (nil when t holds none), its columns in t's order.
func RowBefore(ctx context.Context, tx pgx.Tx, t *plan.Table, key []any, seq change.Seq) ([]any, error) {
	var match string
	args := []any{[]byte(seq)}
	for i, k := range t.KeyNames() {
		match += fmt.Sprintf(" AND %s = $%d", pgx.Identifier{k}.Sanitize(), i+2)
		args = append(args, key[i])
	}
	q := fmt.Sprintf("SELECT %s FROM %s h WHERE h.scd_seq < $1%s ORDER BY h.scd_seq DESC LIMIT 1", colList(t, "h."), t.Hist.Sanitize(), match)
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	var old []any
	if rows.Next() {
		if old, err = rows.Values(); err != nil {
			rows.Close()
			return nil, err
		}
		t.NormalizeRow(old)
	}
	rows.Close() // an error after the last row comes with the close
	return old, rows.Err()
}
