package history

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/pgcodec"
	"github.com/scd2sink/scd2sink/sink/plan"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
)

// SideRow is a row of the side table to insert or delete.
type SideRow struct {
	Key   []any
	Event fold.Event
}

// T1Row carries a key's Type 1 values for its versions below sequence
// below (all of them when nil): the versions from below on are rewritten
// whole anyway.
type T1Row struct {
	Key   []any
	Row   []any
	Below change.Seq
	// Since is the key's fold.Latest.ClosedFrom (zero: unknown).
	Since time.Time
}

// Writes collects one table's changes of one batch, executed set-based.
type Writes struct {
	// Pre is what the transaction read ahead (Prefetch): the column
	// types its COPYs take instead of a describe each.
	Pre         *Prefetched
	DelVersions []int64
	DelSide     []SideRow
	T1Bulk      []T1Row
	CloseOnly   []*fold.Version
	Full        []*fold.Version
	InsVersions []*fold.Version
	InsSide     []SideRow
	Repairs     []RepairNote // late repairs, audited in <target>_scd_repairs
	dir         []dirRow     // keys left with a closed latest version (keydir.go)
	// mem is where the transaction's fold and appendKey take versions,
	// states, lists and rows from; its boxes hold the bookkeeping values
	// of the rows written.
	mem fold.Mem
}

// Slabs returns w's slabs (nil for a nil w: the heap).
func (w *Writes) Slabs() *fold.Mem {
	if w == nil {
		return nil
	}
	return &w.mem
}

// unnest renders "unnest($a::t[], ...) AS alias(n1, ...)" for column arrays.
func unnest(alias string, first int, types, names []string) string {
	casts := make([]string, len(types))
	for i, t := range types {
		casts[i] = fmt.Sprintf("$%d::%s[]", first+i, t)
	}
	return fmt.Sprintf("unnest(%s) AS %s(%s)", strings.Join(casts, ", "), alias, strings.Join(names, ", "))
}

// column gathers n values into an array argument. As a FlatArray, pgx
// encodes it without reflection ([]any and [][]byte otherwise take its
// reflective path, element by element).
func column[T any](n int, get func(int) T) pgtype.FlatArray[T] {
	out := make(pgtype.FlatArray[T], n)
	for i := range out {
		out[i] = get(i)
	}
	return out
}

func genericNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// keyMatch renders "h.k1 = x.k0 AND ..." for generic key aliases.
func keyMatch(t *plan.Table, h, x string) string {
	parts := make([]string, len(t.KeyIdx))
	for i, k := range t.KeyNames() {
		parts[i] = fmt.Sprintf("%s.%s = %s.k%d", h, pgx.Identifier{k}.Sanitize(), x, i)
	}
	return strings.Join(parts, " AND ")
}

// Exec executes w's changes to t in tx, set-based; or, given a Later and
// when they fit one (few rows, nothing read around them), queues them on
// it, to go with other tables' when it runs.
func (w *Writes) Exec(ctx context.Context, tx pgx.Tx, t *plan.Table, later *Later) error {
	if later != nil && w.fits(t) {
		return w.queue(tx, t, later)
	}
	audit, err := w.recordRepairsBefore(ctx, tx, t)
	if err != nil {
		return err
	}
	if err := w.execWrites(ctx, tx, t); err != nil {
		return err
	}
	return w.recordRepairsAfter(ctx, tx, t, audit)
}

func (w *Writes) execWrites(ctx context.Context, tx pgx.Tx, t *plan.Table) (err error) {
	hist, side := t.Hist.Sanitize(), t.Side.Sanitize()
	if t.Parts != nil {
		defer func() {
			var pgErr *pgconn.PgError
			if catalog.NoPartition(err) && errors.As(err, &pgErr) {
				t.Parts.Forget()
				// PostgreSQL names the row's partition key in the detail:
				// which valid_to found no partition, and which times the
				// batch made sure of.
				err = fmt.Errorf("%w (%s; partitions made sure of for %d closing times)", err, pgErr.Detail, len(w.closedTimes()))
			}
		}()
		if err := t.Parts.Ensure(ctx, tx, w.closedTimes()); err != nil {
			return err
		}
	}
	// The deletes and updates go to PostgreSQL together, one round trip
	// (a table's share of a steady load's batch is a few rows: each round
	// trip costs about as much CPU as folding them).
	var p pipe
	if err := w.queueUpdates(&p, tx, t); err != nil {
		return err
	}
	if _, err := p.run(ctx, tx); err != nil {
		return err
	}
	if len(w.Full) > 0 {
		if err := w.execFull(ctx, tx, t); err != nil {
			return err
		}
	}
	if len(w.InsVersions) > 0 {
		cols := append(t.ColNames(), "valid_from", "valid_to", "is_current", "scd_seq", "scd_close_seq", "scd_op", "scd_hash", "scd_unavailable", "scd_absent", "scd_raw_t", "scd_attnum")
		if t.DeletedCol {
			cols = append(cols, "scd_deleted")
		}
		if _, err := pgcodec.CopyIn(ctx, tx, t.Hist, cols, w.Pre.columnTypes(t.Hist), len(w.InsVersions), func(i int, row []any) []any {
			v := w.InsVersions[i]
			row = appendBook(t, append(row, v.Row...), v, &w.mem.Boxes)
			if t.DeletedCol {
				row = append(row, v.Deleted())
			}
			return row
		}); err != nil {
			return fmt.Errorf("inserting versions into %s: %w", hist, err)
		}
	}
	if len(w.InsSide) > 0 {
		cols := append(t.ColNames(), "scd_seq", "scd_op", "scd_t", "scd_hash", "scd_unavailable", "scd_absent", "scd_raw_t", "scd_attnum")
		if _, err := pgcodec.CopyIn(ctx, tx, t.Side, cols, w.Pre.columnTypes(t.Side), len(w.InsSide), func(i int, row []any) []any {
			sr := &w.InsSide[i]
			if sr.Event.Row != nil {
				row = append(row, sr.Event.Row...)
			} else {
				row = row[:len(t.Cols)]
				clear(row)
				for k, ki := range t.KeyIdx {
					row[ki] = sr.Key[k]
				}
			}
			b := &w.mem.Boxes
			return append(row, b.Bytes(sr.Event.Seq), opText[sr.Event.Op], b.Time(sr.Event.T), b.Bytes(sr.Event.Hash), sr.Event.Unavail, sr.Event.Absent, timeOrNil(sr.Event.Raw, b), attnumOf(t, sr.Event.Complete))
		}); err != nil {
			return fmt.Errorf("inserting side rows into %s: %w", side, err)
		}
	}
	return w.writeDir(ctx, tx, t)
}

// queueUpdates queues on p w's deletes, Type 1 updates and closes of t,
// in that order.
func (w *Writes) queueUpdates(p *pipe, tx pgx.Tx, t *plan.Table) error {
	hist, side := t.Hist.Sanitize(), t.Side.Sanitize()
	if len(w.DelVersions) > 0 {
		p.add("deleting versions of "+hist, fmt.Sprintf("DELETE FROM %s WHERE scd_id = ANY($1::bigint[])", hist), w.DelVersions)
	}
	if len(w.DelSide) > 0 {
		types, names, args := keySeqColumns(t, len(w.DelSide),
			func(j int) []any { return w.DelSide[j].Key }, func(j int) []byte { return w.DelSide[j].Event.Seq }, &w.mem.Boxes)
		q := fmt.Sprintf("DELETE FROM %s e USING %s WHERE %s AND e.scd_seq = x.seq", side, unnest("x", 1, types, names), keyMatch(t, "e", "x"))
		p.add("deleting side rows of "+side, q, args...)
	}
	if len(w.T1Bulk) > 0 && len(t.Type1) > 0 {
		if err := w.execType1(p, tx, t); err != nil {
			return err
		}
	}
	if len(w.CloseOnly) > 0 {
		vs := w.CloseOnly
		types, names, args := versionKeys(t, vs, &w.mem.Boxes)
		types, names = append(types, "timestamptz", "bytea"), append(names, "vt", "cs")
		args = append(args, column(len(vs), func(i int) any { return w.mem.Boxes.Time(vs[i].To) }),
			column(len(vs), func(i int) any { return w.mem.Boxes.Bytes(vs[i].CloseSeq) }))
		p.add("closing versions of "+hist, closeStmt(t, types, names), args...)
	}
	return nil
}

// closeStmt is the statement that closes versions in t, one per row of
// the arrays (the versions' keys and sequences, then their valid_to and
// closing sequence: types and names as versionKeys gives them, with
// "vt" and "cs" added). It only builds the text; Exec runs it.
func closeStmt(t *plan.Table, types, names []string) string {
	cur := ""
	if t.Parts != nil {
		// Only a key's open version is closed here (appendKey), and in a
		// partitioned table it is in the current versions' partition (a
		// closed row cannot have a NULL valid_to): the plan touches that
		// one instead of probing every partition.
		cur = " AND h.is_current"
	}
	return fmt.Sprintf("UPDATE %s h SET valid_to = x.vt, is_current = false, scd_close_seq = x.cs FROM %s WHERE %s AND h.scd_seq = x.seq%s",
		t.Hist.Sanitize(), unnest("x", 1, types, names), keyMatch(t, "h", "x"), cur)
}

// execType1 writes the Type 1 values of w.t1Bulk to the keys' stored
// versions. In a partitioned table, the keys whose closed versions all end
// at or after a known time (t1Row.since) are updated among the current
// versions and, apart, among the closed ones from that time on (the
// partitions before it pruned at run time; none for keys without closed
// versions): the others in every partition. Every statement names the
// parent table, so locks are taken parent first, as by the other writes.
func (w *Writes) execType1(p *pipe, tx pgx.Tx, t *plan.Table) error {
	if t.Parts == nil {
		return w.updateType1(p, tx, t, w.T1Bulk, "", false)
	}
	var known, unknown, closed []T1Row
	for _, r := range w.T1Bulk {
		switch {
		case r.Since.IsZero():
			unknown = append(unknown, r)
		default:
			known = append(known, r)
			if r.Since.Before(fold.NoneClosed) {
				closed = append(closed, r)
			}
		}
	}
	if err := w.updateType1(p, tx, t, unknown, "", false); err != nil {
		return err
	}
	if err := w.updateType1(p, tx, t, known, " AND h.is_current", false); err != nil {
		return err
	}
	return w.updateType1(p, tx, t, closed, " AND NOT h.is_current AND h.valid_to >= x.since", true)
}

// updateType1 queues on p the update of the versions of rows' keys below
// each one's bound and matching cond (withSince: cond names x.since) to
// their Type 1 values.
func (w *Writes) updateType1(p *pipe, tx pgx.Tx, t *plan.Table, rows []T1Row, cond string, withSince bool) error {
	if len(rows) == 0 {
		return nil
	}
	types, names := t.KeyTypes(), genericNames("k", len(t.KeyIdx))
	var args []any
	for i := range t.KeyIdx {
		args = append(args, column(len(rows), func(j int) any { return rows[j].Key[i] }))
	}
	types, names = append(types, "bytea"), append(names, "below")
	args = append(args, column(len(rows), func(j int) any { return w.mem.Boxes.Bytes(rows[j].Below) }))
	if withSince {
		types, names = append(types, "timestamptz"), append(names, "since")
		args = append(args, column(len(rows), func(j int) time.Time { return rows[j].Since }))
	}
	var sets, lhs, rhs []string
	for n, ci := range t.Type1 {
		typ, arg, val, err := unnestColumn(t, tx, ci, len(rows), func(j int) any { return rows[j].Row[ci] }, fmt.Sprintf("x.c%d", n))
		if err != nil {
			return err
		}
		types = append(types, typ)
		names = append(names, fmt.Sprintf("c%d", n))
		args = append(args, arg)
		q := pgx.Identifier{t.Cols[ci].Name}.Sanitize()
		sets = append(sets, fmt.Sprintf("%s = %s", q, val))
		lhs = append(lhs, "h."+q)
		rhs = append(rhs, val)
	}
	q := fmt.Sprintf("UPDATE %s h SET %s FROM %s WHERE %s AND (x.below IS NULL OR h.scd_seq < x.below)%s AND ROW(%s) IS DISTINCT FROM ROW(%s)",
		t.Hist.Sanitize(), strings.Join(sets, ", "), unnest("x", 1, types, names), keyMatch(t, "h", "x"), cond, strings.Join(lhs, ", "), strings.Join(rhs, ", "))
	p.add("updating Type 1 columns of "+t.Hist.Sanitize(), q, args...)
	return nil
}

// pipe holds statements that go to PostgreSQL together, in one round
// trip, and run in their order; the first that fails names what it did.
type pipe struct {
	b    pgx.Batch
	what []string
}

func (p *pipe) add(what, q string, args ...any) {
	p.b.Queue(q, args...)
	p.what = append(p.what, what)
}

// run returns the index of the statement that failed, with its error.
func (p *pipe) run(ctx context.Context, tx pgx.Tx) (int, error) {
	switch len(p.what) {
	case 0:
		return -1, nil
	case 1:
		q := p.b.QueuedQueries[0]
		if _, err := tx.Exec(ctx, q.SQL, q.Arguments...); err != nil {
			return 0, fmt.Errorf("%s: %w", p.what[0], err)
		}
		return -1, nil
	}
	br := tx.SendBatch(ctx, &p.b)
	for at, what := range p.what {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			// A statement pgx could not prepare or encode fails every
			// statement of the batch: name the one it was.
			var pe pgx.ErrPreprocessingBatch
			if errors.As(err, &pe) {
				for i, q := range p.b.QueuedQueries {
					if q.SQL == pe.SQL() {
						what, at = p.what[i], i
						break
					}
				}
			}
			return at, fmt.Errorf("%s: %w", what, err)
		}
	}
	return -1, br.Close()
}

// versionKeys renders the (key, scd_seq) columns that identify versions, for unnest.
func versionKeys(t *plan.Table, vs []*fold.Version, b *change.Boxes) (types, names []string, args []any) {
	return keySeqColumns(t, len(vs), func(j int) []any { return vs[j].Key }, func(j int) []byte { return vs[j].Seq }, b)
}

// keySeqColumns renders n (key, sequence) pairs as unnest columns k0..,
// seq; the sequences are boxed from b (an array of byte slices boxes each
// element as pgx encodes it: one allocation per element).
func keySeqColumns(t *plan.Table, n int, key func(int) []any, seq func(int) []byte, b *change.Boxes) (types, names []string, args []any) {
	types, names = append(t.KeyTypes(), "bytea"), append(genericNames("k", len(t.KeyIdx)), "seq")
	for i := range t.KeyIdx {
		args = append(args, column(n, func(j int) any { return key(j)[i] }))
	}
	args = append(args, column(n, func(j int) any { return b.Bytes(seq(j)) }))
	return types, names, args
}

// bookWidth is how many columns appendBook appends.
const bookWidth = 11

// appendBook appends a version's bookkeeping columns, in insert order.
// Values are boxed from b.
func appendBook(t *plan.Table, row []any, v *fold.Version, b *change.Boxes) []any {
	var to any
	var cs any
	if v.Closed {
		to = b.Time(v.To)
	}
	if v.CloseSeq != nil {
		cs = b.Bytes(v.CloseSeq)
	}
	return append(row, b.Time(v.From), to, !v.Closed, b.Bytes(v.Seq), cs, opText[v.Op], b.Bytes(v.Hash), v.Unavail, v.Absent, timeOrNil(v.Raw, b), attnumOf(t, v.Complete))
}

// attnumOf is the scd_attnum a row is written with: the table's newest
// column, or NULL for a complete image (it knows every column, those
// added later too: they are null in it).
func attnumOf(t *plan.Table, complete bool) any {
	if complete {
		return nil
	}
	return t.Attnum
}

// timeOrNil is t, or NULL for the zero time.
func timeOrNil(t time.Time, b *change.Boxes) any {
	if t.IsZero() {
		return nil
	}
	return b.Time(t)
}

// opText holds each operation's text, boxed once.
var opText = func() map[change.Op]any {
	m := map[change.Op]any{}
	for _, op := range []change.Op{change.OpCreate, change.OpRead, change.OpUpdate, change.OpDelete, change.OpTruncate} {
		m[op] = op.String()
	}
	return m
}()

func (w *Writes) execFull(ctx context.Context, tx pgx.Tx, t *plan.Table) error {
	vs := w.Full
	types, names, args := versionKeys(t, vs, &w.mem.Boxes)
	var sets []string
	for ci, c := range t.Cols {
		if c.Key {
			continue
		}
		n := fmt.Sprintf("c%d", ci)
		typ, arg, val, err := unnestColumn(t, tx, ci, len(vs), func(i int) any { return vs[i].Row[ci] }, "x."+n)
		if err != nil {
			return err
		}
		types = append(types, typ)
		names = append(names, n)
		args = append(args, arg)
		sets = append(sets, fmt.Sprintf("%s = %s", pgx.Identifier{c.Name}.Sanitize(), val))
	}
	book := []struct{ col, typ string }{
		{"valid_from", "timestamptz"}, {"valid_to", "timestamptz"}, {"is_current", "boolean"},
		{"scd_seq", "bytea"}, {"scd_close_seq", "bytea"}, {"scd_op", "text"}, {"scd_hash", "bytea"},
		{"scd_unavailable", ""}, {"scd_absent", ""}, {"scd_raw_t", "timestamptz"}, {"scd_attnum", "smallint"},
	}
	books := make([]any, 0, len(vs)*bookWidth)
	for _, v := range vs {
		books = appendBook(t, books, v, &w.mem.Boxes)
	}
	for bi, b := range book {
		if b.col == "scd_seq" || b.typ == "" {
			continue // matched on, or set below
		}
		types = append(types, b.typ)
		names = append(names, "b_"+b.col)
		args = append(args, column(len(vs), func(i int) any { return books[i*bookWidth+bi] }))
		sets = append(sets, fmt.Sprintf("%s = x.b_%s", b.col, b.col))
	}
	// unnest flattens arrays of arrays, so the column lists travel joined.
	for _, l := range []struct {
		col  string
		list func(*fold.Version) []string
	}{{"scd_unavailable", func(v *fold.Version) []string { return v.Unavail }}, {"scd_absent", func(v *fold.Version) []string { return v.Absent }}} {
		types, names = append(types, "text"), append(names, "b_"+l.col)
		args = append(args, column(len(vs), func(i int) any {
			if len(l.list(vs[i])) == 0 {
				return nil
			}
			return strings.Join(l.list(vs[i]), "\x1f")
		}))
		sets = append(sets, fmt.Sprintf(`%s = string_to_array(x.b_%s, chr(31))`, l.col, l.col))
	}
	q := fmt.Sprintf("UPDATE %s h SET %s FROM %s WHERE %s AND h.scd_seq = x.seq", t.Hist.Sanitize(), strings.Join(sets, ", "),
		unnest("x", 1, types, names), keyMatch(t, "h", "x"))
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return fmt.Errorf("rewriting versions of %s: %w", t.Hist.Sanitize(), err)
	}
	return nil
}

// unnestColumn renders one source column for an unnest: its array type,
// the argument, and the expression giving the value from ref. unnest
// flattens arrays of arrays, so array columns travel as their text and are
// cast back; so do columns of a type pgx has no codec for (an enum, a
// domain, citext, an extension's type), whose arrays it cannot encode.
func unnestColumn(t *plan.Table, tx pgx.Tx, ci, n int, get func(int) any, ref string) (typ string, arg any, val string, err error) {
	c := &t.Cols[ci]
	m := tx.Conn().TypeMap()
	_, known := m.TypeForOID(c.OID)
	if known && !strings.HasSuffix(c.TypeName, "[]") {
		if !pgcodec.RawArrayFits(m, c.OID) {
			return c.Cast(), column(n, get), ref, nil // a type pgx sends as text
		}
		pgcodec.Register(m) // RawArray's plan (a batch's transaction has it already)
		raw, err := pgcodec.NewRawArray(m, c.OID, n, get)
		if err != nil {
			return "", nil, "", fmt.Errorf("column %s: %w", c.Name, err)
		}
		return c.Cast(), raw, ref, nil
	}
	texts := make(pgtype.FlatArray[any], n)
	for i := range texts {
		v := get(i)
		if v == nil {
			continue
		}
		s, err := textOf(m, c.OID, known, v)
		if err != nil {
			return "", nil, "", fmt.Errorf("column %s: %w", c.Name, err)
		}
		texts[i] = s
	}
	return "text", texts, fmt.Sprintf("%s::%s", ref, c.Cast()), nil
}

// textOf is v in PostgreSQL's text form for a column of type oid (known:
// pgx has a codec for it), as a cast from text reads it back.
func textOf(m *pgtype.Map, oid uint32, known bool, v any) (string, error) {
	if x, ok := v.(string); ok && !known {
		return x, nil // an enum's label, a citext, a domain over text
	}
	if !known {
		// A domain over another type, or an extension's: the value's own
		// type spells it.
		typ, ok := m.TypeForValue(v)
		if !ok {
			return "", fmt.Errorf("no text form for a %T value", v)
		}
		oid = typ.OID
	}
	b, err := m.Encode(oid, pgtype.TextFormatCode, v, nil)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// closedTimes are the valid_to of the versions w writes closed.
func (w *Writes) closedTimes() []time.Time {
	var out []time.Time
	for _, vs := range [][]*fold.Version{w.CloseOnly, w.Full, w.InsVersions} {
		for _, v := range vs {
			if v.Closed {
				out = append(out, v.To)
			}
		}
	}
	return out
}
