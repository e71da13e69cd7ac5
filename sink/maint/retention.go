package maint

// Retention removes, per key, the versions closed before the horizon
// and the side rows before the first version left, and records where it
// cut in a side row of operation 'h' (horizonOp of package sink, whose
// writers read it: see its retention.go for what the fold does with it).

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/sink/catalog"
	"go.uber.org/zap"
)

// RetainResult is what one retention pass over a table removed.
type RetainResult struct {
	Horizon  time.Time // versions closed before it were removed
	Versions int64
	SideRows int64
	Keys     int64
	Chunks   int
	// Partitions is how many emptied partitions of a partitioned table
	// wholly before the horizon were dropped; PartitionsWaiting how many
	// such partitions could not get their lock and wait for the next pass.
	Partitions        int
	PartitionsWaiting int
}

// Retain runs one retention pass over target's history table: in
// transactions of tuning.RetentionChunk keys, each fenced like a writer (the
// topic's writers wait, at most lock_timeout) and retried while the
// failure is transient. now is the pass's clock. A pass that removed
// anything makes every writer forget what it remembers, once, at its end.
// progress, if set, is called after each chunk commits.
func (m *Maint) Retain(ctx context.Context, target string, now time.Time, progress func(RetainResult)) (RetainResult, error) {
	var res RetainResult
	spec, ok := m.w.Spec(target)
	if !ok {
		return res, fmt.Errorf("retention of %s: no such table is configured", target)
	}
	if spec.Retention <= 0 {
		return res, nil
	}
	t, err := m.table(ctx, spec)
	if err != nil || t == nil {
		return res, err // not created yet: nothing to remove
	}
	res.Horizon = now.Add(-spec.Retention)
	marks, err := m.w.Watermarks(ctx)
	if err != nil {
		return res, err
	}
	w, ok := marks[target]
	if !ok {
		// No watermark: a partition never applied, or no progress yet.
		// What its late events need is unknown, so nothing goes.
		res.Horizon = time.Time{}
		return res, nil
	}
	if w.Before(res.Horizon) {
		res.Horizon = w // a partition behind: its late events may still need the versions
	}
	chunk := retentionSQL(t)
	nk := len(t.KeyIdx)
	// Every writer fences (DESIGN.md section 6): once per pass that
	// removed anything, whether it ends or fails midway, not once per
	// chunk (each would empty every member's whole state cache).
	defer func() {
		if res.Keys == 0 {
			return
		}
		if _, err := m.cfg.Retry(ctx, "retention", "fencing the writers of "+target, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, m.pool, func(tx pgx.Tx) error { return m.w.NoteOutsideWrite(ctx, tx) })
		}); err != nil {
			m.cfg.Logger.Warn("retention: fencing the writers after a pass failed (what they keep of the keys is still valid)",
				zap.String("target", target), zap.Error(err))
		}
	}()
	for _, phase := range []struct{ name, pick, remove string }{{"versions", chunk.pickHist, chunk.fromHist}, {"side", chunk.pickSide, chunk.fromSide}} {
		var last []string
		for {
			// The next keys with something to remove are found before
			// any lock is taken, a window of tuning.RetentionWindow rows at a
			// time in key order: writers do not wait for the scan of a
			// large table, and no read holds a snapshot for long.
			var pick retentionPick
			if _, err := m.cfg.Retry(ctx, "retention", "finding old versions of "+target, func(ctx context.Context) (err error) {
				pick, err = m.retentionCandidates(ctx, target, phase.pick, chunk.after, res.Horizon, last, nk)
				return err
			}); err != nil {
				return res, err
			}
			for len(pick.cand) > 0 {
				cand := pick.cand[:min(len(pick.cand), m.cfg.Tuning.RetentionChunk)]
				pick.cand = pick.cand[len(cand):]
				if m.cfg.Tuning.AfterRetentionPick != nil {
					m.cfg.Tuning.AfterRetentionPick(phase.name)
				}
				n, v, sr, err := m.retainChunk(ctx, spec, t, chunk.mark, phase.remove, res.Horizon, cand)
				if err != nil {
					return res, err
				}
				res.Keys += n
				res.Versions += v
				res.SideRows += sr
				if n > 0 {
					res.Chunks++
					if progress != nil {
						progress(res)
					}
				}
			}
			if pick.last == nil {
				break
			}
			last = pick.last
		}
	}
	if t.Parts != nil {
		n, waiting, err := m.dropEmptyBefore(ctx, spec, t.Parts, res.Horizon)
		res.Partitions += n
		res.PartitionsWaiting += waiting
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// retainChunk removes, in one transaction fenced like a writer, what
// retention removes of the candidate keys cand (text, see
// retentionStatements) that still qualify, and records their horizon
// rows; it returns the keys, versions and side rows removed.
func (m *Maint) retainChunk(ctx context.Context, spec catalog.TableSpec, t *catalog.Table, mark, remove string, horizon time.Time, cand [][]string) (n, v, sr int64, err error) {
	target := spec.Target
	nk := len(t.KeyIdx)
	keyArgs := make([]any, 0, nk+1)
	keyArgs = append(keyArgs, horizon)
	for i := range nk {
		col := make([]string, len(cand))
		for j := range cand {
			col[j] = cand[j][i]
		}
		keyArgs = append(keyArgs, col)
	}
	_, err = m.cfg.Retry(ctx, "retention", "removing old versions of "+target, func(ctx context.Context) error {
		n, v, sr = 0, 0, 0
		return pgx.BeginFunc(ctx, m.pool, func(tx pgx.Tx) error {
			if err := m.w.LockWriters(ctx, tx, spec, []string{target}); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, keysAsTextSettings); err != nil {
				return err
			}
			// Under the lock, the removal checks each candidate again:
			// what it removes is what the key holds now.
			rows, err := tx.Query(ctx, remove, keyArgs...)
			if err != nil {
				return fmt.Errorf("removing old versions of %s: %w", target, err)
			}
			keys := make([][]string, nk)
			var seqs [][]byte
			var times []pgtype.Timestamptz
			for rows.Next() {
				vals, err := rows.Values()
				if err != nil {
					rows.Close()
					return err
				}
				for i := range nk {
					k, _ := vals[i].(string)
					keys[i] = append(keys[i], k)
				}
				seqs = append(seqs, bytesOf(vals[nk]))
				var at pgtype.Timestamptz
				switch x := vals[nk+1].(type) {
				case time.Time:
					at = pgtype.Timestamptz{Time: x, Valid: true}
				case pgtype.InfinityModifier:
					at = pgtype.Timestamptz{InfinityModifier: x, Valid: true}
				default:
					rows.Close()
					return fmt.Errorf("removing old versions of %s: a removed time is %T", target, vals[nk+1])
				}
				times = append(times, at)
				v += vals[nk+2].(int64)
				sr += vals[nk+3].(int64)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("removing old versions of %s: %w", target, err)
			}
			n = int64(len(seqs))
			if n == 0 {
				return nil
			}
			args := make([]any, 0, nk+2)
			for i := range nk {
				args = append(args, keys[i])
			}
			args = append(args, seqs, times)
			if _, err := tx.Exec(ctx, mark, args...); err != nil {
				return fmt.Errorf("recording the retention horizon of %s: %w", target, err)
			}
			// No writer keeps the state of a key with nothing current
			// while its table has retention (package apply's Applier.Table), and nothing a
			// kept state holds of a key with a current version is
			// removed: the pass fences once, at its end (Retain).
			return nil
		})
	})
	return n, v, sr, err
}

// retentionStatements are the statements of a retention chunk.
type retentionStatements struct {
	// pickHist and pickSide find, unlocked, the next keys (in key order,
	// after /*after*/, at most $2) that have a version closed before $1,
	// or (pickSide) no version but side rows before $1.
	pickHist, pickSide string
	// fromHist and fromSide remove, under the writers' lock, what
	// retention removes for the candidate keys ($2..., arrays) that
	// still qualify as their pick found them; they return per key the
	// highest sequence and time removed and the versions and side rows
	// removed.
	fromHist, fromSide string
	// after is the condition that starts a pick after the last key
	// ($3...).
	after string
	// mark records the horizon rows: keys, sequences, times as arrays.
	mark string
}

func retentionSQL(t *catalog.Table) retentionStatements {
	keys := t.KeyNames()
	kl := catalog.QuoteIdents(keys)
	match := t.KeyJoin
	prefixed := func(p string) string {
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = p + "." + pgx.Identifier{k}.Sanitize()
		}
		return strings.Join(parts, ", ")
	}
	// Keys travel as text between statements (a pick and its chunk, a
	// removal and its horizon rows): every type's text form reads back
	// as the same value, infinite dates and times included.
	asText := func(p string) string {
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = p + "." + pgx.Identifier{k}.Sanitize() + "::text"
		}
		return strings.Join(parts, ", ")
	}
	var after []string
	for i, kt := range t.KeyTypes() {
		after = append(after, fmt.Sprintf("$%d::text::%s", i+3, kt))
	}
	notNull := make([]string, len(keys))
	for i, k := range keys {
		notNull[i] = pgx.Identifier{k}.Sanitize() + " IS NOT NULL"
	}
	hist, side := t.Hist.Sanitize(), t.Side.Sanitize()
	// The versions left are those from the first one not closed before
	// $1 on; side rows go before it (or, with no version left, those
	// before $1). The key's earlier horizon row goes too: the new one
	// is at or after it.
	// A partitioned table's key directory loses the keys left without
	// any version (nothing of theirs is to be looked up any more).
	dir := ""
	if t.Parts != nil {
		dir = fmt.Sprintf(`
		dd AS (DELETE FROM %s d USING f WHERE %s AND f.s IS NULL),`, t.Parts.Dir().Sanitize(), match("d", "f"))
	}
	body := func(pick string) string {
		return fmt.Sprintf(`WITH k AS (%[1]s),
		f AS (SELECT k.*, (SELECT h.scd_seq FROM %[2]s h WHERE %[4]s AND (h.valid_to IS NULL OR h.valid_to >= $1) ORDER BY h.scd_seq LIMIT 1) AS s FROM k),%[11]s
		dv AS (DELETE FROM %[2]s h USING f WHERE %[5]s AND h.valid_to < $1 AND (f.s IS NULL OR h.scd_seq < f.s)
			RETURNING %[6]s, CASE WHEN f.s IS NULL OR h.scd_close_seq < f.s THEN greatest(h.scd_seq, h.scd_close_seq) ELSE h.scd_seq END AS scd_seq, h.valid_to AS t),
		ds AS (DELETE FROM %[3]s e USING f WHERE %[7]s AND (CASE WHEN f.s IS NULL THEN e.scd_t < $1 ELSE e.scd_seq < f.s END)
			RETURNING %[8]s, e.scd_seq, e.scd_t AS t, e.scd_op = 'h' AS hz)
		SELECT %[10]s, (array_agg(x.scd_seq ORDER BY x.scd_seq DESC))[1], max(x.t), count(*) FILTER (WHERE x.v), count(*) FILTER (WHERE NOT x.v AND NOT x.hz)
		FROM (SELECT %[6]s, h.scd_seq, h.t, true AS v, false AS hz FROM dv h
			UNION ALL SELECT %[8]s, e.scd_seq, e.t, false, e.hz FROM ds e) x
		GROUP BY %[9]s ORDER BY %[9]s`,
			pick, hist, side, match("h", "k"), match("h", "f"), prefixed("h"), match("e", "f"), prefixed("e"), prefixed("x"), asText("x"), dir)
	}
	var cand []string
	for i, kt := range t.KeyTypes() {
		cand = append(cand, fmt.Sprintf("$%d::text[]::%s[]", i+2, kt))
	}
	candidates := fmt.Sprintf("SELECT * FROM unnest(%s) AS c(%s)", strings.Join(cand, ", "), kl)
	fromHist := body(fmt.Sprintf(`SELECT c.* FROM (%[1]s) c WHERE EXISTS (SELECT 1 FROM %[2]s h WHERE %[3]s AND h.valid_to < $1)`,
		candidates, hist, match("h", "c")))
	fromSide := body(fmt.Sprintf(`SELECT c.* FROM (%[1]s) c WHERE NOT EXISTS (SELECT 1 FROM %[2]s h WHERE %[3]s)
		AND EXISTS (SELECT 1 FROM %[4]s e WHERE %[5]s AND e.scd_t < $1 AND e.scd_op <> 'h')`,
		candidates, hist, match("h", "c"), side, match("e", "c")))
	// A pick reads the next $2 rows in key order (an index scan that
	// stops there) and returns each key in them, whether it is a
	// candidate, and how many of the rows it had.
	pickHist := fmt.Sprintf(`SELECT %[4]s, bool_or(w.valid_to < $1), count(*)
		FROM (SELECT %[1]s, h.valid_to FROM %[2]s h WHERE %[3]s /*after*/ ORDER BY %[1]s, h.scd_seq LIMIT $2) w
		GROUP BY %[1]s ORDER BY %[1]s`,
		kl, hist, strings.Join(notNull, " AND "), asText("w"))
	pickSide := fmt.Sprintf(`SELECT %[4]s,
			CASE WHEN bool_or(w.scd_t < $1 AND w.scd_op <> 'h') THEN NOT EXISTS (SELECT 1 FROM %[5]s h WHERE %[6]s) ELSE false END, count(*)
		FROM (SELECT %[1]s, e.scd_t, e.scd_op FROM %[2]s e WHERE %[3]s /*after*/ ORDER BY %[1]s, e.scd_seq LIMIT $2) w
		GROUP BY %[1]s ORDER BY %[1]s`,
		kl, side, strings.Join(notNull, " AND "), asText("w"), hist, match("h", "w"))
	var casts []string
	for i, kt := range t.KeyTypes() {
		casts = append(casts, fmt.Sprintf("$%d::text[]::%s[]", i+1, kt))
	}
	n := len(keys)
	mark := fmt.Sprintf(`INSERT INTO %s (%s, scd_seq, scd_op, scd_t, scd_hash)
		SELECT %s, x.s, 'h', x.t, ''::bytea FROM unnest(%s, $%d::bytea[], $%d::timestamptz[]) AS x(%s, s, t)`,
		side, kl, prefixed("x"), strings.Join(casts, ", "), n+1, n+2, kl)
	return retentionStatements{pickHist: pickHist, pickSide: pickSide, fromHist: fromHist, fromSide: fromSide,
		after: fmt.Sprintf("AND ROW(%s) > ROW(%s)", kl, strings.Join(after, ", ")), mark: mark}
}

// RetainedTargets lists the targets with a retention: the configured
// tables', and those of pattern entries this group has claimed.
func (m *Maint) RetainedTargets(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, spec := range m.w.Specs() {
		if spec.Retention > 0 && !seen[spec.Target] {
			seen[spec.Target] = true
			out = append(out, spec.Target)
		}
	}
	if !m.cfg.Patterns {
		return out, nil
	}
	rows, err := m.pool.Query(ctx, fmt.Sprintf(`SELECT target FROM %s.%s WHERE consumer_group = $1 ORDER BY target`,
		pgx.Identifier{m.cfg.Schema}.Sanitize(), catalog.ClaimsTable), m.cfg.ConsumerGroup)
	if err != nil {
		return nil, fmt.Errorf("reading the claimed targets: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading the claimed targets: %w", err)
	}
	for _, target := range claimed {
		if spec, ok := m.w.Spec(target); ok && spec.Retention > 0 && !seen[target] {
			seen[target] = true
			out = append(out, target)
		}
	}
	return out, nil
}

// retentionPick is what one pick found: the candidate keys (as text),
// and the last key it read when it read a whole window (nil: the table
// ends inside the window).
type retentionPick struct {
	cand [][]string
	last []string
}

// keysAsTextSettings makes the text form of keys read back as the same
// values whatever the session's defaults (a DateStyle with zone
// abbreviations, fewer float digits).
const keysAsTextSettings = `SELECT set_config('DateStyle', 'ISO', true), set_config('extra_float_digits', '3', true),
	set_config('IntervalStyle', 'postgres', true)`

// retentionCandidates runs a retention pick (retentionStatements) of
// target after the key last (nil: from the first) in a short read-only
// transaction: it reads at most tuning.RetentionWindow rows. The last key of a
// full window is a candidate whatever its rows read said, as the rest
// of its rows are not read; the removal checks it again.
func (m *Maint) retentionCandidates(ctx context.Context, target, pick, after string, horizon time.Time, last []string, nk int) (retentionPick, error) {
	var out retentionPick
	err := pgx.BeginTxFunc(ctx, m.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		out = retentionPick{}
		if _, err := tx.Exec(ctx, keysAsTextSettings); err != nil {
			return err
		}
		q, args := pick, []any{horizon, m.cfg.Tuning.RetentionWindow}
		if last != nil {
			q = strings.Replace(q, "/*after*/", after, 1)
			for _, k := range last {
				args = append(args, k)
			}
		}
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		read := int64(0)
		var key []string
		var isCand bool
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return err
			}
			key = make([]string, nk)
			for i := range nk {
				key[i], _ = vals[i].(string)
			}
			isCand, _ = vals[nk].(bool)
			if isCand {
				out.cand = append(out.cand, key)
			}
			n, _ := vals[nk+1].(int64)
			read += n
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if read >= int64(m.cfg.Tuning.RetentionWindow) && key != nil {
			out.last = key
			if !isCand {
				out.cand = append(out.cand, key)
			}
		}
		return nil
	})
	if err != nil {
		return retentionPick{}, fmt.Errorf("finding old versions of %s: %w", target, err)
	}
	return out, nil
}
