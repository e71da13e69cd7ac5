package erasure

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
)

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
type Set struct {
	schema string
	secret []byte
	// group is the writers' consumer group, deadLetters their
	// dead-letter table (Erase's defaults).
	group, deadLetters string
	// retry runs one step of maintenance with retries (the sink's).
	retry func(ctx context.Context, stage, what string, fn func(context.Context) error) (int, error)
	// alias names the table this Sink writes the history of a target
	// erasures were recorded for (Config.ErasureAlias; nil: the target).
	alias func(string) string
	// decodeKey reads a record's key as the decoder does (Config.DecodeKey).
	decodeKey func(ctx context.Context, topic string, key []byte, headers []plan.Header) (vals []any, names []string, err error)
	// spec gives a target's spec (its key columns).
	spec func(target string) (catalog.TableSpec, bool)

	mu     sync.Mutex
	erased map[string]map[string]bool
	stale  atomic.Bool
	// kconv converts the keys read back, under kmu: a pgtype.Map of its
	// own, apart from the planner's.
	kmu   sync.Mutex
	kconv plan.Converter
}

// Config is what a Set is made of.
type Config struct {
	// Schema holds the service's tables; Secret is the key hashes are
	// made with (erasure_key_file).
	Schema string
	Secret []byte
	// Group is the writers' consumer group and DeadLetters their
	// dead-letter table (Erase's defaults).
	Group, DeadLetters string
	// Alias names the table a Sink writes the history of a target
	// erasures were recorded for (nil: the target).
	Alias func(string) string
	// DecodeKey reads a record's key as the decoder does.
	DecodeKey func(ctx context.Context, topic string, key []byte, headers []plan.Header) (vals []any, names []string, err error)
	// Spec gives a target's spec (its key columns).
	Spec func(target string) (catalog.TableSpec, bool)
	// Retry runs one step of maintenance with retries.
	Retry func(ctx context.Context, stage, what string, fn func(context.Context) error) (int, error)
}

// New returns a Set that reads the erased keys before its first
// use.
func New(cfg Config) *Set {
	s := &Set{schema: cfg.Schema, secret: cfg.Secret, group: cfg.Group, deadLetters: cfg.DeadLetters, retry: cfg.Retry,
		alias: cfg.Alias, decodeKey: cfg.DecodeKey, spec: cfg.Spec, kconv: plan.NewConverter()}
	s.stale.Store(true)
	return s
}

// Reload reads the erased keys now.
func (s *Set) Reload(ctx context.Context, q catalog.Querier) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.load(ctx, q)
}

// hash is the erasure hash of a key identity.
func (s *Set) hash(id string) string { return keyHash(s.secret, id) }

// load reads the erased hashes of every target, by the table this
// Sink writes its history to. The caller holds mu.
func (s *Set) load(ctx context.Context, q catalog.Querier) error {
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

// Drop takes the events and dead letters of erased keys out of a
// batch, after its fence (reloading the erased hashes when the fence saw
// an outside write), and returns what it dropped per target.
func (s *Set) Drop(ctx context.Context, tx pgx.Tx, plans map[string]*plan.TablePlan, targets []string, dead []plan.DeadLetter) (map[string]int, []plan.DeadLetter, error) {
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
	for _, name := range targets {
		set := s.erased[name]
		tp := plans[name]
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
func (s *Set) erasedDeadLetter(ctx context.Context, set map[string]bool, d *plan.DeadLetter) bool {
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
func (s *Set) anyErased(set map[string]bool, rs []keyReading) bool {
	for _, r := range rs {
		if set[s.hash(r.id)] {
			return true
		}
	}
	return false
}

// HasKeyHeaders reports whether hs holds a key-change header.
func HasKeyHeaders(hs []plan.Header) bool {
	for _, h := range hs {
		for _, k := range keyChangeHeaders {
			if strings.ReplaceAll(h.Key, `\0`, "\x00") == k {
				return true
			}
		}
	}
	return false
}

// Stale makes the next batch read the erased keys again (an erase, an
// outside write, a transaction whose fence read nothing).
func (s *Set) Stale() { s.stale.Store(true) }
