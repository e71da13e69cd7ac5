package sink

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/scd2sink/scd2sink/sink/catalog"
	"github.com/scd2sink/scd2sink/sink/plan"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"go.uber.org/zap"
)

// Erasure (DESIGN.md section 12). Erase removes every trace of a key —
// its versions, side rows, repair audits and dead letters — in one
// transaction per target, and records the erasure in scd2sink_erasures
// as a keyed hash of the key's identity (HMAC-SHA256 under
// Config.ErasureSecret), never the key. The table is a log: a row per
// erasure and per lift, the latest row of a (target, hash) deciding.
//
// Every writer keeps the set of erased hashes per table and drops the
// events (and dead letters) of erased keys after its fence, inside the
// batch's transaction, before anything is written: an erase takes the
// locks of every partition recorded for its target's topic, so a batch of
// those partitions either committed before it (and its rows are erased)
// or fences after it; the erase bumps every group's outside-writes count,
// so that fence sees it, forgets its cached states and reloads the set.

// ErrErasureKey is returned when scd2sink_erasures holds erasures but the
// Sink has no erasure secret, or not the one they were recorded with:
// erased keys could not be recognised, so nothing is applied.
var ErrErasureKey = errors.New("erasure_key_file")

// keyHash is the erasure hash of a key identity (keyID).
func keyHash(secret []byte, id string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("scd2sink erasure\x00"))
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil))
}

// textHash is the erasure hash of a key's values as text (PostgreSQL's
// text form of the typed values): what a dead letter whose record was
// never decoded is matched by.
func textHash(secret []byte, texts []string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("scd2sink erasure text\x00"))
	m.Write([]byte(strings.Join(texts, "\x00")))
	return hex.EncodeToString(m.Sum(nil))
}

// keyCheck identifies a secret without revealing it: recorded with every
// erasure, so that a writer started with another secret stops.
func keyCheck(secret []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("scd2sink erasure key check"))
	return hex.EncodeToString(m.Sum(nil))[:16]
}

// erasures is what a Sink knows of erased keys: their hashes per table,
// read from scd2sink_erasures (again whenever a fence saw an outside
// write: stale), and how to read a key back the way erase hashed it
// (erasekeys.go). erased is guarded by mu; the key reader by kmu.
type erasures struct {
	schema string
	secret []byte
	// alias names the table this Sink writes the history of a target
	// erasures were recorded for (Config.ErasureAlias; nil: the target).
	alias func(string) string
	// decodeKey reads a record's key as the decoder does (Config.DecodeKey).
	decodeKey func(ctx context.Context, topic string, key []byte, headers []plan.Header) (vals []any, names []string, err error)
	// spec gives a target's spec (its key columns).
	spec func(target string) (TableSpec, bool)

	mu     sync.Mutex
	erased map[string]map[string]bool
	stale  atomic.Bool
	// kconv converts the keys read back, under kmu: a pgtype.Map of its
	// own, apart from the planner's.
	kmu   sync.Mutex
	kconv plan.Converter
}

// hash is the erasure hash of a key identity.
func (s *erasures) hash(id string) string { return keyHash(s.secret, id) }

// load reads the erased hashes of every target, by the table this
// Sink writes its history to. The caller holds mu.
func (s *erasures) load(ctx context.Context, q Querier) error {
	rows, err := q.Query(ctx, fmt.Sprintf(`SELECT target, key_hash, key_check, coalesce(text_hash, '') FROM (
			SELECT DISTINCT ON (target, key_hash) target, key_hash, action, key_check, text_hash FROM %s.%s ORDER BY target, key_hash, id DESC) e
		WHERE action = 'erase'`, pgx.Identifier{s.schema}.Sanitize(), catalog.ErasuresTable))
	if err != nil {
		return fmt.Errorf("reading %s: %w", catalog.ErasuresTable, err)
	}
	defer rows.Close()
	erased := map[string]map[string]bool{}
	check := ""
	if len(s.secret) > 0 {
		check = keyCheck(s.secret)
	}
	for rows.Next() {
		var target, hash, kc, th string
		if err := rows.Scan(&target, &hash, &kc, &th); err != nil {
			return fmt.Errorf("reading %s: %w", catalog.ErasuresTable, err)
		}
		if check == "" {
			return fmt.Errorf("%w: %s records erased keys, and no erasure_key_file is configured to recognise them", ErrErasureKey, catalog.ErasuresTable)
		}
		if kc != check {
			return fmt.Errorf("%w: the erasures of %s were recorded with another key than erasure_key_file's", ErrErasureKey, target)
		}
		if s.alias != nil {
			target = s.alias(target)
		}
		if erased[target] == nil {
			erased[target] = map[string]bool{}
		}
		erased[target][hash] = true
		if th != "" {
			erased[target][th] = true
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", catalog.ErasuresTable, err)
	}
	s.erased = erased
	return nil
}

// drop takes the events and dead letters of erased keys out of a
// batch, after its fence (reloading the erased hashes when the fence saw
// an outside write), and returns what it dropped per target.
func (s *erasures) drop(ctx context.Context, tx pgx.Tx, p *Prepared, dead []plan.DeadLetter) (map[string]int, []plan.DeadLetter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stale.Swap(false) {
		if err := s.load(ctx, tx); err != nil {
			s.stale.Store(true)
			return nil, nil, err
		}
	}
	if len(s.erased) == 0 {
		return nil, dead, nil
	}
	var out map[string]int
	count := func(target string, n int) {
		if out == nil {
			out = map[string]int{}
		}
		out[target] += n
	}
	for _, name := range p.targets {
		set := s.erased[name]
		tp := p.plans[name]
		if len(set) == 0 || tp == nil {
			continue
		}
		// A new slice: the parts of a batch may share the order's array.
		var kept []*plan.KeyPlan
		for j, kp := range tp.Order {
			if !set[s.hash(kp.ID)] {
				if kept != nil {
					kept = append(kept, kp)
				}
				continue
			}
			if kept == nil {
				kept = append(make([]*plan.KeyPlan, 0, len(tp.Order)), tp.Order[:j]...)
			}
			delete(tp.Keys, kp.ID)
			count(name, len(kp.Events))
		}
		if kept != nil {
			tp.Order = kept
		}
	}
	var keptDead []plan.DeadLetter
	for _, d := range dead {
		set := s.erased[d.Table]
		if len(set) > 0 && s.erasedDeadLetter(ctx, set, &d) {
			count(d.Table, 1)
			continue
		}
		if len(set) > 0 && d.KeyCols != nil && len(d.Headers) > 0 {
			// Another key's dead letter keeps no header naming an
			// erased key (a primary-key change's).
			d.Headers, _ = s.erasedHeaders(ctx, d.KeyCols, d.Origin.Topic, d.Headers, func(rs []keyReading) bool { return s.anyErased(set, rs) })
		}
		keptDead = append(keptDead, d)
	}
	return out, keptDead, nil
}

// erasedDeadLetter reports whether d is a dead letter of a key in set: by
// its key's identity, whatever form the key took in it (letterKeyIDs),
// else by its key's values as text.
func (s *erasures) erasedDeadLetter(ctx context.Context, set map[string]bool, d *plan.DeadLetter) bool {
	if d.KeyID != "" {
		return set[s.hash(d.KeyID)]
	}
	if d.KeyCols != nil {
		if rs, ok := s.letterKeyIDs(ctx, d.KeyCols, d); ok {
			return s.anyErased(set, rs)
		}
	}
	spec, ok := s.spec(d.Table)
	if !ok || len(spec.Keys) == 0 {
		return false
	}
	vals, ok := deadLetterKey(d.Key, d.Decoded, spec.Keys)
	return ok && set[textHash(s.secret, vals)]
}

// anyErased reports whether one of the readings is erased in set. (A
// reading of a key form without a schema that happens to be an erased key
// drops the dead letter: keeping an erased key out comes first.)
func (s *erasures) anyErased(set map[string]bool, rs []keyReading) bool {
	for _, r := range rs {
		if set[s.hash(r.id)] {
			return true
		}
	}
	return false
}

// hasKeyHeaders reports whether hs holds a key-change header.
func hasKeyHeaders(hs []plan.Header) bool {
	for _, h := range hs {
		for _, k := range keyChangeHeaders {
			if strings.ReplaceAll(h.Key, `\0`, "\x00") == k {
				return true
			}
		}
	}
	return false
}

// noteLetterKeys gives the dead letters whose key has no identity yet
// their table's key columns, loading a table not loaded yet (a batch of
// dead letters alone after a restart), so that the writers' filter reads
// their keys back (erasures.erasedDeadLetter). Called holding s.mu.
func (s *Sink) noteLetterKeys(ctx context.Context, dead []plan.DeadLetter) {
	var load []*change.Event
	seen := map[string]bool{}
	for _, d := range dead {
		if (d.KeyID == "" || hasKeyHeaders(d.Headers)) && !seen[d.Table] && s.tables[d.Table] == nil {
			seen[d.Table] = true
			load = append(load, &change.Event{Table: d.Table})
		}
	}
	if len(load) > 0 {
		if err := s.loadExisting(ctx, load); err != nil {
			s.log.Warn("loading a dead letter's table to read its key back failed: an erased key's dead letter in another form than its text is not recognised",
				zap.Error(err))
		}
	}
	cols := map[string][]catalog.ColumnInfo{}
	for i := range dead {
		d := &dead[i]
		if d.KeyID != "" && !hasKeyHeaders(d.Headers) {
			continue
		}
		kc, ok := cols[d.Table]
		if !ok {
			if t := s.tables[d.Table]; t != nil {
				kc = t.KeyColumns()
			}
			cols[d.Table] = kc
		}
		d.KeyCols = kc
	}
}
