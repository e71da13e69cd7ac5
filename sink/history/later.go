package history

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink/fold"
	"github.com/scd2sink/scd2sink/sink/pgcodec"
	"github.com/scd2sink/scd2sink/sink/plan"
)

// laterRows is the most rows (versions and side rows) a table's share may
// insert and still go with the others' (Later): below it an INSERT from
// arrays costs PostgreSQL about what a COPY does, and saves the COPY's
// round trips; above it COPY's multi-row inserts are cheaper.
const laterRows = 256

// laterBytes bounds the values of a share's rows that go with the
// others' (estimated, change.ValuesSize): they are held until Later runs,
// and each column travels as one array value (PostgreSQL's limit for one
// is 1 GB), where COPY streams rows in 64 KiB pieces.
const laterBytes = 8 << 20

// Later holds the writes of several tables' shares of a batch, to go to
// PostgreSQL together, in one round trip, when Run is called. A steady
// load's batch gives each table a few rows: one round trip per statement
// and a COPY per table (two round trips and a goroutine each) cost more
// of our CPU than folding the rows did. A table's statements keep their
// order; tables' writes are independent of each other (different
// tables), so queuing one table's behind another's reads changes
// nothing. Whoever reads a table whose writes are queued runs Later
// first (the second pass of a primary-key change, the no-overlap check).
// Later belongs to the transaction's goroutine; a retried transaction
// starts a new one.
type Later struct {
	p pipe
	// owner is the target of each queued statement.
	owner []string
}

// Pending reports whether statements wait to be run.
func (l *Later) Pending() bool { return l != nil && len(l.p.what) > 0 }

// Run sends the queued statements in tx, in their order, and empties l.
// A statement's failure is its table's: a *plan.TargetError naming the
// target (the rest of the transaction is void anyway); a failure no
// statement owns (the round trip's) is returned as it is.
func (l *Later) Run(ctx context.Context, tx pgx.Tx) error {
	if !l.Pending() {
		return nil
	}
	i, err := l.p.run(ctx, tx)
	owners := l.owner
	l.p, l.owner = pipe{}, nil
	if err != nil && i >= 0 && i < len(owners) {
		return &plan.TargetError{Target: owners[i], Err: fmt.Errorf("applying batch to %s: %w", owners[i], err)}
	}
	return err
}

// fits reports whether w's changes to t can be queued on a Later: a plain
// table (a partitioned one makes sure of its partitions, and reads its
// key directory, around its writes), no repairs (they are audited, read
// before and after their writes), no version rewritten whole, and few rows.
func (w *Writes) fits(t *plan.Table) bool {
	if t.Parts != nil || len(w.Repairs) > 0 || len(w.Full) > 0 || len(w.dir) > 0 || len(w.InsVersions)+len(w.InsSide) > laterRows {
		return false
	}
	n := 0
	for _, v := range w.InsVersions {
		n += change.ValuesSize(v.Row, 16)
	}
	for i := range w.InsSide {
		n += change.ValuesSize(w.InsSide[i].Event.Row, 16)
	}
	for i := range w.T1Bulk {
		n += change.ValuesSize(w.T1Bulk[i].Row, 16)
	}
	return n <= laterBytes
}

// queue queues w's changes to t on l, in Exec's order: deletes, Type 1
// updates, closes, then the inserts of versions and side rows (from
// arrays, as COPY would write them).
func (w *Writes) queue(tx pgx.Tx, t *plan.Table, l *Later) error {
	n := len(l.p.what)
	defer func() { // every statement queued is owned, whatever returns
		for range len(l.p.what) - n {
			l.owner = append(l.owner, t.Spec.Target)
		}
	}()
	if err := w.queueUpdates(&l.p, tx, t); err != nil {
		return err
	}
	if len(w.InsVersions) > 0 {
		if err := w.queueInsertVersions(&l.p, tx, t); err != nil {
			return err
		}
	}
	if len(w.InsSide) > 0 {
		return w.queueInsertSide(&l.p, tx, t)
	}
	return nil
}

// insertCols gathers the unnest columns of an insert: each column's array
// type, name in the unnest and argument, and the expression it is
// inserted as.
type insertCols struct {
	types, names, vals []string
	args               []any
	m                  *pgtype.Map // the connection's (source sets it)
	err                error       // the first column that failed to encode
}

func (c *insertCols) add(typ, name, val string, arg any) {
	c.types, c.names, c.vals, c.args = append(c.types, typ), append(c.names, name), append(c.vals, val), append(c.args, arg)
}

// addRaw adds a bookkeeping column of type typ (its OID oid), inserted as
// it is, its n values encoded here (pgcodec.RawArray).
func (c *insertCols) addRaw(typ string, oid uint32, name string, n int, get func(int) any) {
	c.addRawAs(typ, oid, name, "x."+name, n, get)
}

// addRawAs is addRaw with the expression the column is inserted as.
func (c *insertCols) addRawAs(typ string, oid uint32, name, val string, n int, get func(int) any) {
	if c.err != nil {
		return
	}
	raw, err := pgcodec.NewRawArray(c.m, oid, n, get)
	if err != nil {
		c.err = fmt.Errorf("column %s: %w", name, err)
		return
	}
	c.add(typ, name, val, raw)
}

// source adds t's source columns, row(i) giving row i's values (nil for
// a row of NULLs).
func (c *insertCols) source(tx pgx.Tx, t *plan.Table, n int, row func(int) []any) error {
	c.m = tx.Conn().TypeMap()
	pgcodec.Register(c.m) // RawArray's plan (a batch's transaction has it already)
	for ci := range t.Cols {
		name := fmt.Sprintf("c%d", ci)
		typ, arg, val, err := unnestColumn(t, tx, ci, n, func(i int) any {
			if r := row(i); r != nil {
				return r[ci]
			}
			return nil
		}, "x."+name)
		if err != nil {
			return err
		}
		c.add(typ, name, val, arg)
	}
	return nil
}

// list adds a text[] bookkeeping column: unnest flattens arrays of
// arrays, so each list travels joined (NULL stays NULL, an empty list
// stays empty).
func (c *insertCols) list(name string, n int, get func(int) []string) {
	c.addRawAs("text", pgtype.TextOID, name, fmt.Sprintf("string_to_array(x.%s, chr(31))", name), n, func(i int) any {
		l := get(i)
		if l == nil {
			return nil
		}
		return strings.Join(l, "\x1f")
	})
}

// insert renders the statement inserting c's columns into table's cols.
func (c *insertCols) insert(table pgx.Identifier, cols []string) string {
	return fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM %s", table.Sanitize(), strings.Join(quoteAll(cols), ", "),
		strings.Join(c.vals, ", "), unnest("x", 1, c.types, c.names))
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = pgx.Identifier{n}.Sanitize()
	}
	return out
}

// queueInsertVersions queues the insert of w.InsVersions, with the values
// and bookkeeping the COPY of execWrites writes.
func (w *Writes) queueInsertVersions(p *pipe, tx pgx.Tx, t *plan.Table) error {
	vs, b := w.InsVersions, &w.mem.Boxes
	var c insertCols
	if err := c.source(tx, t, len(vs), func(i int) []any { return vs[i].Row }); err != nil {
		return err
	}
	cols := append(t.ColNames(), "valid_from", "valid_to", "is_current", "scd_seq", "scd_close_seq", "scd_op", "scd_hash",
		"scd_unavailable", "scd_absent", "scd_raw_t", "scd_attnum")
	c.addRaw("timestamptz", pgtype.TimestamptzOID, "b_from", len(vs), func(i int) any { return b.Time(vs[i].From) })
	c.addRaw("timestamptz", pgtype.TimestamptzOID, "b_to", len(vs), func(i int) any {
		if !vs[i].Closed {
			return nil
		}
		return b.Time(vs[i].To)
	})
	c.addRaw("boolean", pgtype.BoolOID, "b_cur", len(vs), func(i int) any { return !vs[i].Closed })
	c.addRaw("bytea", pgtype.ByteaOID, "b_seq", len(vs), func(i int) any { return b.Bytes(vs[i].Seq) })
	c.addRaw("bytea", pgtype.ByteaOID, "b_cs", len(vs), func(i int) any {
		if vs[i].CloseSeq == nil {
			return nil
		}
		return b.Bytes(vs[i].CloseSeq)
	})
	c.addRaw("text", pgtype.TextOID, "b_op", len(vs), func(i int) any { return opText[vs[i].Op] })
	c.addRaw("bytea", pgtype.ByteaOID, "b_hash", len(vs), func(i int) any { return b.Bytes(vs[i].Hash) })
	c.list("b_unav", len(vs), func(i int) []string { return vs[i].Unavail })
	c.list("b_abs", len(vs), func(i int) []string { return vs[i].Absent })
	c.addRaw("timestamptz", pgtype.TimestamptzOID, "b_raw", len(vs), func(i int) any { return timeOrNil(vs[i].Raw, b) })
	c.addRaw("smallint", pgtype.Int2OID, "b_att", len(vs), func(i int) any { return attnumOf(t, vs[i].Complete) })
	if t.DeletedCol {
		cols = append(cols, "scd_deleted")
		c.addRaw("boolean", pgtype.BoolOID, "b_del", len(vs), func(i int) any { return vs[i].Deleted() })
	}
	if c.err != nil {
		return c.err
	}
	p.add("inserting versions into "+t.Hist.Sanitize(), c.insert(t.Hist, cols), c.args...)
	return nil
}

// queueInsertSide queues the insert of w.InsSide, as execWrites's COPY
// writes them (a row without an image carries only its key).
func (w *Writes) queueInsertSide(p *pipe, tx pgx.Tx, t *plan.Table) error {
	rows, b := w.InsSide, &w.mem.Boxes
	keyOnly := make([][]any, len(rows))
	for i := range rows {
		if rows[i].Event.Row == nil {
			r := make([]any, len(t.Cols))
			for k, ki := range t.KeyIdx {
				r[ki] = rows[i].Key[k]
			}
			keyOnly[i] = r
		}
	}
	var c insertCols
	if err := c.source(tx, t, len(rows), func(i int) []any {
		if keyOnly[i] != nil {
			return keyOnly[i]
		}
		return rows[i].Event.Row
	}); err != nil {
		return err
	}
	ev := func(i int) *fold.Event { return &rows[i].Event }
	cols := append(t.ColNames(), "scd_seq", "scd_op", "scd_t", "scd_hash", "scd_unavailable", "scd_absent", "scd_raw_t", "scd_attnum")
	c.addRaw("bytea", pgtype.ByteaOID, "b_seq", len(rows), func(i int) any { return b.Bytes(ev(i).Seq) })
	c.addRaw("text", pgtype.TextOID, "b_op", len(rows), func(i int) any { return opText[ev(i).Op] })
	c.addRaw("timestamptz", pgtype.TimestamptzOID, "b_t", len(rows), func(i int) any { return b.Time(ev(i).T) })
	c.addRaw("bytea", pgtype.ByteaOID, "b_hash", len(rows), func(i int) any { return b.Bytes(ev(i).Hash) })
	c.list("b_unav", len(rows), func(i int) []string { return ev(i).Unavail })
	c.list("b_abs", len(rows), func(i int) []string { return ev(i).Absent })
	c.addRaw("timestamptz", pgtype.TimestamptzOID, "b_raw", len(rows), func(i int) any { return timeOrNil(ev(i).Raw, b) })
	c.addRaw("smallint", pgtype.Int2OID, "b_att", len(rows), func(i int) any { return attnumOf(t, ev(i).Complete) })
	if c.err != nil {
		return c.err
	}
	p.add("inserting side rows into "+t.Side.Sanitize(), c.insert(t.Side, cols), c.args...)
	return nil
}
