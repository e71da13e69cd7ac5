package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/scdtest"
)

// leastSQL is the pipeline benchmark's second yardstick (issue 17): the
// same events, in sequence order and in batches of 10,000, applied with the
// least SQL that SCD Type 2 needs, the fold computed beforehand: per batch
// one UPDATE … FROM unnest closing the versions it ends (by key, the
// current one), one spreading the Type 1 values of its events that opened
// no version to every version of their keys, and one COPY of the versions
// it opens (closed already when the same batch ends them). No side table,
// offsets or dead letters: those are what scd2sink pays for exact repair
// and delivery.
//
// The fold is taken from what the binary wrote (every event opened a
// version, scd_seq, or is a side row; a version's close is scd_close_seq),
// so versions carry their final Type 1 values from the start. Which events
// change Type 1 values comes from the workload itself (work: its after
// images compared, key by key); such an event spreads its own Type 1 values
// (a side row's) or the key's final ones (a version's): as many rows
// updated as the real fold, and the same end. The table it produces must
// equal the binary's history (checked). It returns the events applied and
// the time of the batches' transactions.
func leastSQL(b *testing.B, pool *pgxpool.Pool, src *scdtest.Source, work []scdtest.BenchRecord) (int, time.Duration, time.Duration) {
	b.Helper()
	ctx := context.Background()
	hist := pgx.Identifier{src.Table + "_history"}.Sanitize()
	least := pgx.Identifier{src.Table + "_least"}.Sanitize()
	var cols, t1 []string
	for _, c := range src.Cols {
		cols = append(cols, c.Name)
		if c.Name != "id" && !slices.Contains(scdtest.BenchTracked[src.Table], c.Name) {
			t1 = append(t1, c.Name)
		}
	}
	types := map[string]string{}
	trows, err := pool.Query(ctx, `SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0`, src.Table+"_history")
	if err != nil {
		b.Fatal(err)
	}
	for trows.Next() {
		var n, ty string
		if err := trows.Scan(&n, &ty); err != nil {
			b.Fatal(err)
		}
		types[n] = ty
	}
	// JSON travels as its text (pgx would decode it into Go values and
	// lose digits).
	sel := func(cs []string) string {
		var out []string
		for _, c := range cs {
			if strings.HasPrefix(types[c], "json") {
				c += "::text"
			}
			out = append(out, c)
		}
		return strings.Join(out, ", ")
	}
	colList := strings.Join(cols, ", ")
	type version struct {
		seq, closeSeq []byte
		row           []any // cols, then valid_from, valid_to
	}
	type sideEv struct {
		seq []byte
		id  any
		t1  []any // nil: no after image
	}
	var versions []*version
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT scd_seq, scd_close_seq, %s, valid_from, valid_to FROM %s`, sel(cols), hist))
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			b.Fatal(err)
		}
		cs, _ := vals[1].([]byte)
		versions = append(versions, &version{seq: vals[0].([]byte), closeSeq: cs, row: vals[2:]})
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	var side []sideEv
	rows, err = pool.Query(ctx, fmt.Sprintf(`SELECT scd_seq, scd_op, id, %s FROM %s_scd_events`, sel(t1), pgx.Identifier{src.Table + "_history_scd_events"}.Sanitize()))
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			b.Fatal(err)
		}
		e := sideEv{seq: vals[0].([]byte), id: vals[2]}
		if op := vals[1].(string); op != "d" && op != "t" {
			e.t1 = vals[3:]
		}
		side = append(side, e)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	// Per key, in order, whether each change (deletes included) changes
	// the Type 1 values of the last after image.
	// (Keys as text: schemaless tables keep them so.)
	changed := map[string][]bool{}
	last := map[string]string{}
	for _, r := range work {
		if r.Src.Table != src.Table || r.Tombstone {
			continue
		}
		img := r.Change.After
		if img == nil {
			k := fmt.Sprint(r.Change.Before["id"])
			changed[k] = append(changed[k], false)
			continue
		}
		k := fmt.Sprint(img["id"])
		var parts []string
		for _, c := range t1 {
			parts = append(parts, fmt.Sprintf("%#v", img[c]))
		}
		sig := strings.Join(parts, "\x00")
		prev, seen := last[k]
		changed[k] = append(changed[k], !seen || prev != sig)
		last[k] = sig
	}
	type keyEv struct {
		seq []byte
		v   *version
		s   *sideEv
	}
	byKey := map[string][]keyEv{}
	for _, v := range versions {
		k := fmt.Sprint(v.row[0])
		byKey[k] = append(byKey[k], keyEv{seq: v.seq, v: v})
	}
	for i := range side {
		k := fmt.Sprint(side[i].id)
		byKey[k] = append(byKey[k], keyEv{seq: side[i].seq, s: &side[i]})
	}
	// Every event's sequence, in order, cut into batches of 10,000.
	var seqs [][]byte
	for _, v := range versions {
		seqs = append(seqs, v.seq)
	}
	for _, e := range side {
		seqs = append(seqs, e.seq)
	}
	sort.Slice(seqs, func(i, j int) bool { return bytes.Compare(seqs[i], seqs[j]) < 0 })
	batchOf := func(seq []byte) int {
		return sort.Search(len(seqs), func(i int) bool { return bytes.Compare(seqs[i], seq) >= 0 }) / 10_000
	}
	nBatches := (len(seqs) + 9_999) / 10_000
	inserts := make([][][]any, nBatches)
	closeIDs, closeAt := make([][]any, nBatches), make([][]any, nBatches)
	for _, v := range versions {
		ob := batchOf(v.seq)
		row := append([]any(nil), v.row...)
		if v.closeSeq != nil {
			if cb := batchOf(v.closeSeq); cb > ob {
				row[len(cols)+1] = nil // open when inserted; the later batch closes it
				closeIDs[cb], closeAt[cb] = append(closeIDs[cb], v.row[0]), append(closeAt[cb], v.row[len(cols)+1])
			}
		}
		inserts[ob] = append(inserts[ob], append(row, row[len(cols)+1] == nil))
	}
	// The last Type 1 change of each key in each batch spreads.
	spreads := make([][]sideEv, nBatches)
	for k, evs := range byKey {
		sort.Slice(evs, func(i, j int) bool { return bytes.Compare(evs[i].seq, evs[j].seq) < 0 })
		if len(evs) != len(changed[k]) {
			b.Fatalf("key %s of %s: %d events in the history, %d in the workload", k, src.Table, len(evs), len(changed[k]))
		}
		lastIn := map[int]sideEv{}
		for i, e := range evs {
			if !changed[k][i] || i == 0 {
				continue // (the first after image opens the first version: nothing to spread to)
			}
			se := sideEv{seq: e.seq}
			if e.s != nil {
				se.id, se.t1 = e.s.id, e.s.t1
			} else {
				se.id = e.v.row[0]
				for _, c := range t1 {
					se.t1 = append(se.t1, e.v.row[slices.Index(cols, c)])
				}
			}
			lastIn[batchOf(e.seq)] = se
		}
		for bi, se := range lastIn {
			spreads[bi] = append(spreads[bi], se)
		}
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s AS SELECT %s, valid_from, valid_to, is_current FROM %s WITH NO DATA;
		ALTER TABLE %s SET (fillfactor = 70); CREATE INDEX ON %s (id)`, least, colList, hist, least, least)); err != nil {
		b.Fatal(err)
	}
	insertCols := append(append([]string(nil), cols...), "valid_from", "valid_to", "is_current")
	var dur time.Duration
	pgCPU := postgresCPU()
	for i := range nBatches {
		start := time.Now()
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if len(closeIDs[i]) > 0 {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s l SET valid_to = x.vt, is_current = false
				FROM unnest($1::%s[], $2::timestamptz[]) x(id, vt) WHERE l.id = x.id AND l.is_current`, least, types["id"]), closeIDs[i], closeAt[i]); err != nil {
				b.Fatal(err)
			}
		}
		if len(spreads[i]) > 0 {
			args := []any{column(spreads[i], func(e sideEv) any { return e.id })}
			var sets, names, casts []string
			for j, c := range t1 {
				args = append(args, column(spreads[i], func(e sideEv) any { return e.t1[j] }))
				sets = append(sets, fmt.Sprintf("%s = x.%s", c, c))
				names = append(names, c)
				casts = append(casts, fmt.Sprintf("$%d::%s[]", j+2, types[c]))
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s l SET %s FROM unnest($1::%s[], %s) x(id, %s) WHERE l.id = x.id`,
				least, strings.Join(sets, ", "), types["id"], strings.Join(casts, ", "), strings.Join(names, ", ")), args...); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{src.Table + "_least"}, insertCols, pgx.CopyFromRows(inserts[i])); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		dur += time.Since(start)
	}
	pgCPU = postgresCPU() - pgCPU
	var diff int
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM ((SELECT %[1]s, valid_from, valid_to, is_current FROM %[2]s EXCEPT ALL
		SELECT %[1]s, valid_from, valid_to, is_current FROM %[3]s) UNION ALL (SELECT %[1]s, valid_from, valid_to, is_current FROM %[3]s EXCEPT ALL
		SELECT %[1]s, valid_from, valid_to, is_current FROM %[2]s)) d`, colList, hist, least)).Scan(&diff); err != nil {
		b.Fatal(err)
	}
	if diff != 0 {
		b.Fatalf("the least-SQL table of %s differs from the binary's history in %d rows", src.Table, diff)
	}
	return len(seqs), dur, pgCPU
}

// column gathers one value of each element.
func column[T any](xs []T, f func(T) any) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}
