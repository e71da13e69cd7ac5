package carry

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// Import (DESIGN.md section 13) reads an SCD2 table kept elsewhere — a
// dbt snapshot, a hand-written MERGE's table — as carried versions: each
// version is an event at its valid_from with its row, sequenced by
// change.ImportedSeq (by time, before every sequence a source gives), and
// a version closed with no version of its key starting where it ends is
// closed by a delete at its end (dbt's hard_deletes: invalidate, a row
// deleted at the source). A row marked deleted (dbt's hard_deletes:
// new_record) is a delete at its valid_from. The sink folds them as it
// folds any event: a later Debezium snapshot read with the same tracked
// values opens no version, and importing again changes nothing (the same
// events, the same sequences and digests: duplicates).

// Layout names the columns of an SCD2 table that are not the row's.
type Layout struct {
	ValidFrom, ValidTo string
	// Deleted, when set, names a column marking the rows that record a
	// delete (dbt's dbt_is_deleted: 'True').
	Deleted string
	// Skip names further bookkeeping columns that are not imported.
	Skip []string
}

// DBT is the layout of a dbt snapshot.
var DBT = Layout{ValidFrom: "dbt_valid_from", ValidTo: "dbt_valid_to", Deleted: "dbt_is_deleted", Skip: []string{"dbt_scd_id", "dbt_updated_at"}}

// Foreign is an SCD2 table to import into a target's history.
type Foreign struct {
	Schema, Table string
	Layout
	// Keys are the target's key columns; Ignore the columns it leaves out
	// (ignore_columns).
	Keys, Ignore []string
	// TargetSchema and Target name the history table the events are for.
	TargetSchema, Target string
}

// Invalid is a version import refuses.
type Invalid struct {
	Key       string // the key's values, as text
	ValidFrom string
	ValidTo   string
	Why       string
}

// ImportCounts is what an import read and wrote.
type ImportCounts struct {
	Keys, Versions, Deletes int64
}

// maxInvalid bounds the invalid versions listed (the rest are counted).
const maxInvalid = 1000

// farFuture is where a valid_to stands for "still current" (dbt's
// dbt_valid_to_current, 9999-12-31) rather than an end.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// importPlan is what reading f needs.
type importPlan struct {
	keys   []string
	cols   []column // the row's columns (keys included), as imported
	exists bool     // the target's table exists (values are cast to its types)
	types  map[string]string
	from   string // the foreign table, quoted
	vf, vt string // its interval columns as UTC timestamptz expressions
	del    string // the deleted flag's expression
}

func (f Foreign) plan(ctx context.Context, pool *pgxpool.Pool) (*importPlan, error) {
	p := &importPlan{from: pgx.Identifier{f.Schema, f.Table}.Sanitize()}
	var found bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", p.from).Scan(&found); err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("--from %s.%s: no such table", f.Schema, f.Table)
	}
	// The interval columns may bear the history's own names (valid_from);
	// the row's columns never do (an is_current, an scd_id of the other
	// layout's bookkeeping is not imported).
	cols, err := allColumns(ctx, pool, p.from)
	if err != nil {
		return nil, err
	}
	rowCols, err := columns(ctx, pool, p.from)
	if err != nil {
		return nil, err
	}
	byName := map[string]column{}
	for _, c := range cols {
		byName[c.name] = c
	}
	timeExpr := func(flag, name string) (string, error) {
		c, ok := byName[name]
		if !ok {
			return "", fmt.Errorf("%s: %s.%s has no column %q", flag, f.Schema, f.Table, name)
		}
		q := pgx.Identifier{name}.Sanitize()
		switch {
		case c.typ == "timestamp with time zone":
			return q, nil
		case strings.HasPrefix(c.typ, "timestamp"):
			return "(" + q + " AT TIME ZONE 'UTC')", nil
		case c.typ == "date":
			return "(" + q + "::timestamp AT TIME ZONE 'UTC')", nil
		}
		return "", fmt.Errorf("%s: column %s of %s.%s is of type %s, not a timestamp or date", flag, name, f.Schema, f.Table, c.typ)
	}
	if p.vf, err = timeExpr("--valid-from", f.ValidFrom); err != nil {
		return nil, err
	}
	if p.vt, err = timeExpr("--valid-to", f.ValidTo); err != nil {
		return nil, err
	}
	p.del = "false"
	if _, ok := byName[f.Deleted]; ok && f.Deleted != "" {
		p.del = fmt.Sprintf("coalesce(%s::text IN ('True', 'true', 't', 'TRUE', '1'), false)", pgx.Identifier{f.Deleted}.Sanitize())
	}
	skip := append([]string{f.ValidFrom, f.ValidTo, f.Deleted}, f.Skip...)
	for _, c := range rowCols {
		if !slices.Contains(skip, c.name) && !slices.Contains(f.Ignore, c.name) {
			p.cols = append(p.cols, c)
		}
	}
	if len(f.Keys) == 0 {
		return nil, fmt.Errorf("%s has no key columns: name them with keys in its tables entry", f.Target)
	}
	for _, k := range f.Keys {
		if !slices.ContainsFunc(p.cols, func(c column) bool { return c.name == k }) {
			return nil, fmt.Errorf("--from %s.%s has no key column %q of %s", f.Schema, f.Table, k, f.Target)
		}
	}
	p.keys = f.Keys
	target := pgx.Identifier{f.TargetSchema, f.Target}.Sanitize()
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", target).Scan(&p.exists); err != nil {
		return nil, err
	}
	p.types = map[string]string{}
	if p.exists {
		into, err := columns(ctx, pool, target)
		if err != nil {
			return nil, err
		}
		for _, c := range into {
			p.types[c.name] = c.typ
		}
		for _, c := range p.cols {
			if _, ok := p.types[c.name]; !ok {
				return nil, fmt.Errorf("column %s of %s.%s: %s has no such column (add it, or list it in ignore_columns)", c.name, f.Schema, f.Table, f.Target)
			}
		}
	} else {
		for _, c := range p.cols {
			p.types[c.name] = c.typ
		}
	}
	return p, nil
}

// castKeys renders the key columns cast to the target's types, as
// k1, k2, … when as is set.
func (p *importPlan) castKeys(prefix string, as bool) []string {
	out := make([]string, len(p.keys))
	for i, k := range p.keys {
		out[i] = fmt.Sprintf("%s%s::%s", prefix, pgx.Identifier{k}.Sanitize(), p.types[k])
		if as {
			out[i] += fmt.Sprintf(" AS k%d", i+1)
		}
	}
	return out
}

// Check lists the versions of f that import refuses: a NULL key or
// valid_from, an infinite valid_from, a valid_to not after its
// valid_from, a time in the future (but the far-future end that stands
// for "current"), two versions of a key at one valid_from, a version
// that starts before the previous one ends (or after one never closed),
// and, in a target that holds events of a key from its source, a version
// of the key that starts at or ends after the first of them (imported
// history comes before the source's: it would be folded before events it
// follows, their times moved). It returns at most maxInvalid of them and
// how many there are.
func Check(ctx context.Context, pool *pgxpool.Pool, f Foreign) ([]Invalid, int64, error) {
	p, err := f.plan(ctx, pool)
	if err != nil {
		return nil, 0, err
	}
	nullKey := make([]string, len(p.keys))
	ks := make([]string, len(p.keys))
	match := make([]string, len(p.keys))
	for i, k := range p.keys {
		nullKey[i] = pgx.Identifier{k}.Sanitize() + " IS NULL"
		ks[i] = fmt.Sprintf("k%d", i+1)
		match[i] = fmt.Sprintf("y.k%d = fi.k%[1]d", i+1)
	}
	// The first time of each key's events from the source (sequences not
	// imported) in the target, when it exists.
	var first string
	if p.exists {
		keyCols := make([]string, len(p.keys))
		for i, k := range p.keys {
			keyCols[i] = fmt.Sprintf("%s AS k%d", pgx.Identifier{k}.Sanitize(), i+1)
		}
		hist := pgx.Identifier{f.TargetSchema, f.Target}.Sanitize()
		side := pgx.Identifier{f.TargetSchema, f.Target + "_scd_events"}.Sanitize()
		first = fmt.Sprintf(`SELECT %[1]s, min(t) AS first FROM (
				SELECT %[2]s, valid_from AS t FROM %[3]s WHERE get_byte(scd_seq, 0) <> %[5]d
				UNION ALL SELECT %[2]s, scd_t FROM %[4]s WHERE get_byte(scd_seq, 0) <> %[5]d AND scd_op <> 'h') u GROUP BY %[1]s`,
			strings.Join(ks, ", "), strings.Join(keyCols, ", "), hist, side, change.ImportedTag)
	}
	if !p.exists {
		nulls := make([]string, len(p.keys))
		for i, k := range p.keys {
			nulls[i] = fmt.Sprintf("NULL::%s AS k%d", p.types[k], i+1)
		}
		first = fmt.Sprintf("SELECT %s, NULL::timestamptz AS first WHERE false", strings.Join(nulls, ", "))
	}
	vt := fmt.Sprintf("CASE WHEN %[1]s >= $1 THEN NULL ELSE %[1]s END", p.vt)
	q := fmt.Sprintf(`WITH fi AS (%[8]s)
		SELECT concat_ws(', ', %[1]s), coalesce(vf::text, 'NULL'), coalesce(vt::text, 'NULL'), why, count(*) OVER () FROM (
		SELECT y.*, CASE
			WHEN nullkey THEN 'a key column is NULL'
			WHEN vf IS NULL THEN 'valid_from is NULL'
			WHEN NOT isfinite(vf) THEN 'valid_from is infinite'
			WHEN vt <= vf THEN 'valid_to is not after valid_from'
			WHEN vf > now() OR vt > now() THEN 'a time in the future (a far-future valid_to means current only from the year 9999 on)'
			WHEN vf = prev_vf THEN 'two versions of the key at one valid_from'
			WHEN n > 1 AND prev_vt IS NULL THEN 'starts after a version of the key that is never closed'
			WHEN vf < prev_vt THEN 'overlaps the previous version of the key'
			WHEN fi.first IS NOT NULL AND (vf >= fi.first OR vt > fi.first) THEN
				'reaches into the key''s history from the source, which starts at ' || fi.first::text || ' in the target'
		END AS why FROM (
			SELECT %[2]s, %[3]s AS nullkey, %[4]s AS vf, %[5]s AS vt,
				lag(%[4]s) OVER w AS prev_vf, lag(%[5]s) OVER w AS prev_vt, row_number() OVER w AS n
			FROM %[6]s WINDOW w AS (PARTITION BY %[7]s ORDER BY %[4]s, %[5]s NULLS LAST)) y
		LEFT JOIN fi ON %[9]s) z
		WHERE why IS NOT NULL ORDER BY %[1]s, vf LIMIT %[10]d`,
		strings.Join(ks, ", "), strings.Join(p.castKeys("", true), ", "), strings.Join(nullKey, " OR "), p.vf, vt, p.from,
		strings.Join(p.castKeys("", false), ", "), first, strings.Join(match, " AND "), maxInvalid)
	conn, err := readConn(ctx, pool)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, q, farFuture)
	if err != nil {
		return nil, 0, fmt.Errorf("checking the versions of %s.%s: %w", f.Schema, f.Table, err)
	}
	defer rows.Close()
	var out []Invalid
	var total int64
	for rows.Next() {
		var iv Invalid
		if err := rows.Scan(&iv.Key, &iv.ValidFrom, &iv.ValidTo, &iv.Why, &total); err != nil {
			return nil, 0, err
		}
		out = append(out, iv)
	}
	return out, total, rows.Err()
}

// importRow names the imported row's columns with their types, so that a
// target the import creates gets them (the events carry their values in
// After).
type importRow struct{ cols []change.Column }

func (r *importRow) Columns() []change.Column { return r.cols }

func (r *importRow) DecodeRow([]byte) (map[string]any, error) {
	return nil, fmt.Errorf("an imported row has no raw image")
}

// version is one row of the foreign table.
type version struct {
	key     []any
	row     map[string]any
	from    time.Time
	to      *time.Time
	deleted bool
	digest  string
}

// ReadImport streams f's versions as events to apply, in chunks of about
// chunk events (a key's events are never split), in key and time order.
// Run Check first: ReadImport does not look for invalid versions.
func ReadImport(ctx context.Context, pool *pgxpool.Pool, f Foreign, chunk int, apply func([]*change.Event) error) (ImportCounts, error) {
	var c ImportCounts
	p, err := f.plan(ctx, pool)
	if err != nil {
		return c, err
	}
	conn, err := readConn(ctx, pool)
	if err != nil {
		return c, err
	}
	defer conn.Close(context.Background())
	sel := make([]string, len(p.cols))
	var cols []change.Column
	for i, col := range p.cols {
		sel[i] = fmt.Sprintf("%s::%s", pgx.Identifier{col.name}.Sanitize(), p.types[col.name])
		cols = append(cols, change.Column{Name: col.name, PGType: p.types[col.name]})
	}
	var row change.RowDecoder = &importRow{cols}
	if p.exists {
		row = nil // the target's columns stand
	}
	keyAt := make([]int, len(p.keys))
	for i, k := range p.keys {
		keyAt[i] = slices.IndexFunc(p.cols, func(c column) bool { return c.name == k })
	}
	rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT %[1]s, %[2]s, CASE WHEN %[3]s >= $1 THEN NULL ELSE %[3]s END, %[4]s
		FROM %[5]s ORDER BY %[6]s, %[2]s, %[3]s NULLS LAST`,
		strings.Join(sel, ", "), p.vf, p.vt, p.del, p.from, strings.Join(p.castKeys("", false), ", ")), farFuture)
	if err != nil {
		return c, fmt.Errorf("reading %s.%s: %w", f.Schema, f.Table, err)
	}
	defer rows.Close()
	n := len(p.cols)
	var canon []byte
	var batch []*change.Event
	var key []version
	var lastKey string
	emit := func() {
		if len(key) == 0 {
			return
		}
		c.Keys++
		evs := keyEvents(f.Target, key, row)
		for _, e := range evs {
			if e.Op == change.OpDelete {
				c.Deletes++
			} else {
				c.Versions++
			}
		}
		batch = append(batch, evs...)
		key = key[:0]
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return c, fmt.Errorf("reading %s.%s: %w", f.Schema, f.Table, err)
		}
		v := version{key: make([]any, len(p.keys)), row: make(map[string]any, n)}
		for i, at := range keyAt {
			v.key[i] = sink.Stored(vals[at])
		}
		// The digest of the values themselves (change.AppendCanon), not
		// of a text form that depends on the session's settings:
		// importing again gives the same digests.
		canon = canon[:0]
		for i, col := range p.cols {
			v.row[col.name] = sink.Stored(vals[i])
			canon = append(canon, col.name...)
			canon = append(change.AppendCanon(append(canon, 0), vals[i]), 0)
		}
		sum := sha256.Sum256(canon)
		v.digest = string(sum[:16])
		v.from, _ = vals[n].(time.Time)
		if to, ok := vals[n+1].(time.Time); ok {
			v.to = &to
		}
		v.deleted, _ = vals[n+2].(bool)
		id := change.KeyID(keyValues(vals, keyAt))
		if id != lastKey {
			emit()
			if len(batch) >= chunk {
				if err := apply(batch); err != nil {
					return c, err
				}
				batch = nil
			}
			lastKey = id
		}
		key = append(key, v)
	}
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("reading %s.%s: %w", f.Schema, f.Table, err)
	}
	emit()
	if len(batch) > 0 {
		if err := apply(batch); err != nil {
			return c, err
		}
	}
	return c, nil
}

func keyValues(vals []any, at []int) []any {
	out := make([]any, len(at))
	for i, a := range at {
		out[i] = vals[a]
	}
	return out
}

// keyEvents are the events of one key's versions, in time order: each
// version opens at its valid_from ('c' for the key's first and after a
// delete, else 'u'); a row marked deleted is a delete at its valid_from;
// a version that ends where no version of the key starts is closed by a
// delete at its end.
func keyEvents(target string, vs []version, row change.RowDecoder) []*change.Event {
	var out []*change.Event
	live := false
	for i, v := range vs {
		if v.deleted {
			out = append(out, importEvent(target, v.key, change.OpDelete, v.from, nil, row, ""))
			live = false
			continue
		}
		op := change.OpUpdate
		if !live {
			op = change.OpCreate
		}
		out = append(out, importEvent(target, v.key, op, v.from, v.row, row, v.digest))
		live = true
		if v.to != nil && (i+1 == len(vs) || vs[i+1].from.After(*v.to)) {
			out = append(out, importEvent(target, v.key, change.OpDelete, *v.to, nil, row, ""))
			live = false
		}
	}
	return out
}

func importEvent(target string, key []any, op change.Op, at time.Time, after map[string]any, row change.RowDecoder, digest string) *change.Event {
	ev := &change.Event{Table: target, Key: key, Op: op, Seq: change.ImportedSeq(at), ValidFrom: at, After: after}
	if after != nil {
		ev.Row = row
	}
	// The digest of the version's values, its operation and time: the
	// same table imported again gives the same events (duplicates).
	h := sha256.New()
	var b [9]byte
	b[0] = byte(op)
	binary.BigEndian.PutUint64(b[1:], uint64(at.UnixMicro()))
	h.Write(b[:])
	h.Write([]byte(digest))
	ev.SetHash(h.Sum(nil)[:16])
	return ev
}
