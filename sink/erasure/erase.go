package erasure

// The erase command (Set.Erase); it waits for every writer of the target
// (Writers.LockWriters, the lock retention and partition drops take too).
// What a batch does about erased keys is in erasure.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/maint"
	"github.com/scd2sink/scd2sink/sink/pgcodec"
	"github.com/scd2sink/scd2sink/sink/plan"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EraseRequest asks Erase to erase (or, with Lift, to allow again) keys of
// one target.
type EraseRequest struct {
	Target string
	// Keys are the keys, each its values as text in key column order
	// (cast to the columns' types by PostgreSQL).
	Keys   [][]string
	Reason string
	Lift   bool
	// Also are more history tables holding the target's history (a
	// rebuild's, the ones a swap kept): erased too, with their side and
	// repair tables, when they exist.
	Also []string
	// DeadLetterTables are searched for the keys' dead letters (default:
	// the Sink's).
	DeadLetterTables []string
}

// Erased is what Erase did for one key.
type Erased struct {
	Hash                                     string
	Versions, SideRows, Repairs, DeadLetters int64
}

// EraseResult is what Erase did.
type EraseResult struct {
	Keys []Erased
	// UnreadDeadLetters counts the target's dead letters whose key could
	// not be read (a record that was never decoded, a binary key): they
	// may belong to an erased key and are left for the operator.
	UnreadDeadLetters []int64
	// Headers counts the key-change headers (__debezium.oldkey, newkey)
	// naming an erased key that were taken out of other keys' dead
	// letters.
	Headers int64
}

// Add counts what a second Erase of the same keys did (the tables a
// rebuild kept meanwhile) into res, key by key.
func (res *EraseResult) Add(more EraseResult) {
	for i := range res.Keys {
		for _, m := range more.Keys {
			if m.Hash == res.Keys[i].Hash {
				res.Keys[i].Versions += m.Versions
				res.Keys[i].SideRows += m.SideRows
				res.Keys[i].Repairs += m.Repairs
				res.Keys[i].DeadLetters += m.DeadLetters
			}
		}
	}
	res.Headers += more.Headers
	seen := map[int64]bool{}
	for _, id := range res.UnreadDeadLetters {
		seen[id] = true
	}
	for _, id := range more.UnreadDeadLetters {
		if !seen[id] {
			res.UnreadDeadLetters = append(res.UnreadDeadLetters, id)
		}
	}
}

// Erase erases req.Keys of req.Target (or lifts their erasure), in one
// transaction that waits for the target's writers; see the comment at the
// top of this file.
func (s *Set) Erase(ctx context.Context, w Writers, req EraseRequest) (EraseResult, error) {
	var res EraseResult
	if len(s.secret) == 0 {
		return res, fmt.Errorf("%w: erasing needs a secret to hash keys with; configure erasure_key_file", ErrErasureKey)
	}
	spec, err := w.KeySpec(ctx, req.Target)
	if err != nil {
		return res, err
	}
	for _, k := range req.Keys {
		if len(k) != len(spec.Keys) {
			return res, fmt.Errorf("erasing from %s: a key has %d values, the table's key is (%s)", req.Target, len(k), strings.Join(spec.Keys, ", "))
		}
	}
	kc, err := w.KeyColumns(ctx, spec)
	if err != nil {
		return res, err
	}
	// The service's tables are in s.schema; the history tables in
	// spec.Schema.
	sch := pgx.Identifier{s.schema}.Sanitize()
	dlTables := req.DeadLetterTables
	if len(dlTables) == 0 {
		dlTables = []string{s.deadLetters}
	}
	targets := append([]string{spec.Target}, req.Also...)
	_, err = s.retry(ctx, "erase", "erasing from "+req.Target, func(ctx context.Context) error {
		res = EraseResult{}
		// READ COMMITTED whatever the database's default: each statement
		// sees what the writers it waited for committed (under REPEATABLE
		// READ the snapshot taken before the lock would miss their rows).
		return pgx.BeginTxFunc(ctx, w.Pool(), txOptions, func(tx pgx.Tx) error {
			pgcodec.Register(tx.Conn().TypeMap())
			types, err := columnTypes(ctx, tx, spec.Schema, spec.Target, spec.Keys)
			if err != nil {
				return err
			}
			if err := w.LockWriters(ctx, tx, spec, targets); err != nil {
				return err
			}
			topic := spec.Topic
			if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(max(topic), $2) FROM %s.%s WHERE target = $1`,
				pgx.Identifier{s.schema}.Sanitize(), catalog.ClaimsTable), spec.Target, topic).Scan(&topic); err != nil {
				return fmt.Errorf("reading the topic of %s: %w", spec.Target, err)
			}
			casts := make([]string, len(types))
			textCasts := make([]string, len(types))
			for i, typ := range types {
				casts[i] = fmt.Sprintf("$%d::%s", i+1, typ)
				textCasts[i] = "(" + casts[i] + ")::text"
			}
			keys := make([]erasing, len(req.Keys))
			for n, k := range req.Keys {
				args := make([]any, len(k))
				for i, v := range k {
					args[i] = v
				}
				typed := make([]any, len(k))
				texts := make([]string, len(k))
				ptrs := make([]any, 2*len(k))
				for i := range typed {
					ptrs[i], ptrs[len(k)+i] = &typed[i], &texts[i]
				}
				if err := tx.QueryRow(ctx, "SELECT "+strings.Join(casts, ", ")+", "+strings.Join(textCasts, ", "), args...).Scan(ptrs...); err != nil {
					return fmt.Errorf("reading key %v as (%s): %w", k, strings.Join(types, ", "), err)
				}
				keys[n] = erasing{args: args, id: plan.KeyID(typed), texts: texts, e: Erased{Hash: s.hash(plan.KeyID(typed))}}
			}
			if !req.Lift {
				for n := range keys {
					if err := s.eraseKey(ctx, tx, spec, targets, casts, keys[n].args, &keys[n].e); err != nil {
						return err
					}
				}
				// Every dead-letter table is read once, whatever the
				// number of keys.
				unread, headers, err := s.eraseDeadLetters(ctx, tx, kc, dlTables, spec.Schema, targets, topic, spec.Keys, keys)
				if err != nil {
					return err
				}
				res.UnreadDeadLetters, res.Headers = unread, headers
			}
			for _, k := range keys {
				e := k.e
				texts := k.texts
				action := "erase"
				if req.Lift {
					action = "lift"
				}
				if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.%s (target, key_hash, action, reason, versions, side_rows, repairs, dead_letters, key_check, text_hash)
					VALUES ($1, $2, $3, nullif($4, ''), $5, $6, $7, $8, $9, $10)`, pgx.Identifier{s.schema}.Sanitize(), catalog.ErasuresTable),
					spec.Target, e.Hash, action, req.Reason, e.Versions, e.SideRows, e.Repairs, e.DeadLetters, keyCheck(s.secret),
					textHash(s.secret, texts)); err != nil {
					return fmt.Errorf("recording the erasure: %w", err)
				}
				res.Keys = append(res.Keys, e)
			}
			// Every group's writers (a rebuild's too) forget what they
			// remember and read the erasures again (their fences see the
			// count move).
			if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s.%[2]s AS w (consumer_group, n)
				SELECT consumer_group, 1 FROM %[1]s.%[2]s UNION SELECT consumer_group, 1 FROM %[1]s.scd2sink_offsets UNION SELECT $1, 1
				ON CONFLICT (consumer_group) DO UPDATE SET n = w.n + 1`, sch, catalog.OutsideWritesTable), s.group); err != nil {
				return fmt.Errorf("counting an outside write: %w", err)
			}
			return nil
		})
	})
	s.Stale()
	return res, err
}

// columnTypes reads the types of the named columns of schema.table.
func columnTypes(ctx context.Context, tx pgx.Tx, schema, table string, cols []string) ([]string, error) {
	out := make([]string, len(cols))
	for i, c := range cols {
		if err := tx.QueryRow(ctx, `SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
			WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped`,
			pgx.Identifier{schema, table}.Sanitize(), c).Scan(&out[i]); err != nil {
			return nil, fmt.Errorf("reading the type of %s.%s: %w", table, c, err)
		}
	}
	return out, nil
}

// eraseKey deletes one key's rows from the history tables given (those
// that exist), their side tables and repair audits.
func (s *Set) eraseKey(ctx context.Context, tx pgx.Tx, spec catalog.TableSpec, tables, casts []string, args []any, e *Erased) error {
	cols := make([]string, len(spec.Keys))
	pairs := make([]string, len(spec.Keys))
	for i, k := range spec.Keys {
		cols[i] = pgx.Identifier{k}.Sanitize()
		pairs[i] = fmt.Sprintf("$%d::text, %s", len(args)+i+1, casts[i])
	}
	match := fmt.Sprintf("(%s) = (%s)", strings.Join(cols, ", "), strings.Join(casts, ", "))
	if len(cols) == 1 {
		match = fmt.Sprintf("%s = %s", cols[0], casts[0])
	}
	jargs := append(append([]any(nil), args...), anys(spec.Keys)...)
	for _, name := range tables {
		n := catalog.NamesOf(name)
		del := func(rel, where string, a []any, count *int64) error {
			var exists bool
			id := pgx.Identifier{spec.Schema, rel}.Sanitize()
			if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, id).Scan(&exists); err != nil || !exists {
				return err
			}
			tag, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE %s`, id, where), a...)
			if err != nil {
				return fmt.Errorf("erasing from %s: %w", rel, err)
			}
			*count += tag.RowsAffected()
			return nil
		}
		if err := del(n.Hist, match, args, &e.Versions); err != nil {
			return err
		}
		if err := del(n.Side, match, args, &e.SideRows); err != nil {
			return err
		}
		if err := del(n.Repairs, "key = jsonb_build_object("+strings.Join(pairs, ", ")+")", jargs, &e.Repairs); err != nil {
			return err
		}
		var noted int64 // the key directory of a partitioned table: not a trace of its own, but the key
		if err := del(n.Hist+catalog.DirSuffix, match, args, &noted); err != nil {
			return err
		}
	}
	return nil
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// erasing is one key of an Erase.
type erasing struct {
	args  []any    // its values as given (text)
	id    string   // its identity (keyID of the typed values)
	texts []string // its values as PostgreSQL's text
	e     Erased
}

// eraseDeadLetters reads each dead-letter table once and deletes the dead
// letters of the keys (counted in their Erased), whatever form a key took
// in them (letterKeyIDs; the values as text for a form it cannot read),
// and takes out of the others the key-change headers that name one of
// the keys. It returns the ids of the targets' dead letters whose key
// could not be read at all, and how many headers it took out.
func (s *Set) eraseDeadLetters(ctx context.Context, tx pgx.Tx, kc []catalog.ColumnInfo, dlTables []string, histSchema string, targets []string, topic string, keyNames []string, keys []erasing) ([]int64, int64, error) {
	byID := make(map[string]int, len(keys))
	for i, k := range keys {
		byID[k.id] = i
	}
	match := func(rs []keyReading) int {
		for _, r := range rs {
			if i, ok := byID[r.id]; ok {
				return i
			}
		}
		return -1
	}
	// A key form without a schema read several ways (keyIDsOf) may be an
	// erased key by one reading and a key the table holds by another: such
	// a dead letter is left for the operator (unread), not erased.
	keyMatch := make([]string, len(kc))
	for i, c := range kc {
		keyMatch[i] = fmt.Sprintf("%s = $%d", pgx.Identifier{c.Name}.Sanitize(), i+1)
	}
	held := fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE %s)`, pgx.Identifier{histSchema, targets[0]}.Sanitize(), strings.Join(keyMatch, " AND "))
	ambiguous := func(rs []keyReading) (bool, error) {
		for _, r := range rs {
			if _, ok := byID[r.id]; ok || r.vals == nil {
				continue
			}
			var yes bool
			if err := tx.QueryRow(ctx, held, r.vals...).Scan(&yes); err != nil {
				return false, fmt.Errorf("looking for another key a dead letter may be of: %w", err)
			}
			if yes {
				return true, nil
			}
		}
		return false, nil
	}
	var unread []int64
	var headers int64
	for _, dl := range dlTables {
		var exists bool
		name := pgx.Identifier{s.schema, dl}.Sanitize()
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
			return nil, 0, err
		}
		if !exists {
			continue
		}
		rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT id, topic, key, coalesce(decoded, false), headers FROM %s
			WHERE target = ANY($1) OR ($2 <> '' AND topic = $2) FOR UPDATE`, name), targets, topic)
		if err != nil {
			return nil, 0, fmt.Errorf("reading %s: %w", dl, err)
		}
		type letter struct {
			id int64
			d  plan.DeadLetter
		}
		var letters []letter
		for rows.Next() {
			var l letter
			var hdrs []byte
			if err := rows.Scan(&l.id, &l.d.Origin.Topic, &l.d.Key, &l.d.Decoded, &hdrs); err != nil {
				rows.Close()
				return nil, 0, err
			}
			if len(hdrs) > 0 {
				_ = json.Unmarshal(hdrs, &l.d.Headers) // unreadable headers name no key
			}
			letters = append(letters, l)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, 0, fmt.Errorf("reading %s: %w", dl, err)
		}
		var gone, changed []int64
		var newHeaders [][]byte
		for _, l := range letters {
			i := -1
			rs, ok := s.letterKeyIDs(ctx, kc, &l.d)
			if ok {
				i = match(rs)
				if i >= 0 && len(rs) > 1 {
					amb, err := ambiguous(rs)
					if err != nil {
						return nil, 0, err
					}
					if amb {
						unread = append(unread, l.id)
						continue
					}
				}
			} else if vals, ok := deadLetterKey(l.d.Key, l.d.Decoded, keyNames); ok {
				for n, k := range keys { // a form only its text reads
					if slices.Equal(vals, k.texts) {
						i = n
					}
				}
			} else {
				unread = append(unread, l.id)
			}
			if i >= 0 {
				gone = append(gone, l.id)
				keys[i].e.DeadLetters++
				continue
			}
			if hs, n := s.erasedHeaders(ctx, kc, l.d.Origin.Topic, l.d.Headers, func(rs []keyReading) bool { return match(rs) >= 0 }); n > 0 {
				b, _ := json.Marshal(hs)
				changed, newHeaders = append(changed, l.id), append(newHeaders, b)
				headers += int64(n)
			}
		}
		if len(gone) > 0 {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE id = ANY($1)`, name), gone); err != nil {
				return nil, 0, fmt.Errorf("erasing dead letters from %s: %w", dl, err)
			}
		}
		if len(changed) > 0 {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s d SET headers = x.h FROM unnest($1::bigint[], $2::jsonb[]) AS x(id, h) WHERE d.id = x.id`, name),
				changed, newHeaders); err != nil {
				return nil, 0, fmt.Errorf("erasing key-change headers from %s: %w", dl, err)
			}
		}
	}
	sort.Slice(unread, func(i, j int) bool { return unread[i] < unread[j] })
	return unread, headers, nil
}

// deadLetterKey reads a dead letter's key values as text, in key order.
func deadLetterKey(key []byte, decoded bool, names []string) ([]string, bool) {
	text := func(raw json.RawMessage) (string, bool) {
		var v any
		d := json.NewDecoder(strings.NewReader(string(raw)))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			return "", false
		}
		switch x := v.(type) {
		case string:
			return x, true
		case json.Number:
			return x.String(), true
		case bool:
			return fmt.Sprint(x), true
		}
		return "", false
	}
	var out []string
	if decoded {
		var arr []json.RawMessage
		if json.Unmarshal(key, &arr) != nil || len(arr) != len(names) {
			return nil, false
		}
		for _, r := range arr {
			t, ok := text(r)
			if !ok {
				return nil, false
			}
			out = append(out, t)
		}
		return out, true
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(key, &obj) != nil {
		return nil, false
	}
	if p, ok := obj["payload"]; ok && obj["schema"] != nil {
		obj = nil
		if json.Unmarshal(p, &obj) != nil {
			return nil, false
		}
	}
	for _, n := range names {
		r, ok := obj[n]
		if !ok {
			return nil, false
		}
		t, ok := text(r)
		if !ok {
			return nil, false
		}
		out = append(out, t)
	}
	return out, true
}

// Violations reports the erased keys that still have versions in
// the history table (verify): each key's identity is hashed as writers
// hash it, streaming the table's keys, only when the target has erasures.
func (s *Set) Violations(ctx context.Context, pool *pgxpool.Pool, spec catalog.TableSpec, hist string) ([]maint.Violation, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	pgcodec.Register(conn.Conn().TypeMap())
	s.mu.Lock()
	err = s.load(ctx, conn)
	set := s.erased[spec.Target]
	s.mu.Unlock()
	if err != nil || len(set) == 0 {
		return nil, err
	}
	rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT DISTINCT %s FROM %s`, catalog.QuoteIdents(spec.Keys), hist))
	if err != nil {
		return nil, fmt.Errorf("reading the keys of %s: %w", hist, err)
	}
	defer rows.Close()
	var out []maint.Violation
	n := 0
	for rows.Next() {
		key, err := rows.Values()
		if err != nil {
			return nil, err
		}
		if h := s.hash(plan.KeyID(key)); set[h] {
			if n++; n <= maint.MaxViolationsListed {
				out = append(out, maint.Violation{Table: hist, Check: "an erased key has versions", Key: "(erased " + h[:12] + ")", Info: "erase it again"})
			}
		}
	}
	if n > maint.MaxViolationsListed {
		out = append(out, maint.Violation{Table: hist, Check: "an erased key has versions", Key: "-", More: int64(n - maint.MaxViolationsListed),
			Info: fmt.Sprintf("%d more erased keys with versions not listed (the first %d are)", n-maint.MaxViolationsListed, maint.MaxViolationsListed)})
	}
	return out, rows.Err()
}

// Writers is what Erase needs of the sink that writes the target. The
// sink owns its tables; Erase only reads their description and waits for
// their writers in its own transaction.
type Writers interface {
	// KeySpec returns target's spec with its key columns; an error
	// names the target when it is unknown or has no keys yet. No DDL.
	KeySpec(ctx context.Context, target string) (catalog.TableSpec, error)
	// KeyColumns returns spec's key columns as its history table has
	// them, creating the table when it does not exist yet.
	KeyColumns(ctx context.Context, spec catalog.TableSpec) ([]catalog.ColumnInfo, error)
	// LockWriters waits, in tx, for every writer of the targets (spec's
	// topic's and those recorded for them), for tx's lifetime.
	LockWriters(ctx context.Context, tx pgx.Tx, spec catalog.TableSpec, targets []string) error
	// Pool is where Erase's transaction runs.
	Pool() *pgxpool.Pool
}

// txOptions is Erase's transaction: READ COMMITTED whatever the
// database's default (see Erase).
var txOptions = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
