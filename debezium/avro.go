package debezium

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/scd2sink/scd2sink/debezium/mongo"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
	"github.com/twmb/franz-go/pkg/sr"
	"go.uber.org/zap"
)

func init() {
	// goavro sizes an array from the count a record declares: bound it, so
	// that a corrupt record is an error, not an allocation of gigabytes.
	goavro.MaxBlockCount = 1 << 20
	goavro.MaxBlockSize = 64 << 20
}

// avroSchema is one writer schema, ready to decode: goavro's codec and the
// Connect model of the record.
type avroSchema struct {
	codec *goavro.Codec
	root  *Schema
	row   *rowSchema // the envelope's before/after record, or a key record
	err   error      // the schema cannot be used: records with it are dead letters
	// plan reads an envelope without goavro's maps (avroplan.go); nil:
	// goavro decodes it whole.
	plan *avroPlan
}

// avroWhole makes every envelope decode through goavro's maps (tests
// compare the two ways).
var avroWhole = false

// avroCache holds writer schemas by registry id, and what it knows of ids
// the registry could not give yet.
type avroCache struct {
	reg Registry
	log *zap.Logger
	// lookupTimeout is how long an id the registry does not know (40403:
	// a follower behind, a schema registered a moment ago) is asked for
	// again before its records are dead letters.
	lookupTimeout time.Duration
	mu            sync.Mutex
	m             map[schemaRef]*avroSchema
	misses        map[schemaRef]*miss
	warned        time.Time
}

// miss is an id the registry did not give: when it was first asked for,
// when to ask again, and whether it counts as unknown for good (until
// next: then it is asked once more).
type miss struct {
	first, next time.Time
	backoff     time.Duration
	dead        error
	why         string // what the last answer was
}

func newAvroCache(reg Registry, log *zap.Logger) *avroCache {
	return &avroCache{reg: reg, log: log, m: map[schemaRef]*avroSchema{}, misses: map[schemaRef]*miss{}, lookupTimeout: DefaultLookupTimeout}
}

// DefaultLookupTimeout is schema_registry.lookup_timeout's default.
const DefaultLookupTimeout = 2 * time.Minute

// Retry pacing while the registry is unreachable or does not know an id,
// and how long an id unknown past the lookup timeout is not asked again.
var (
	registryBackoffMin = 100 * time.Millisecond
	registryBackoffMax = 5 * time.Second
	unknownTTL         = 30 * time.Second
)

// get returns the schema with the given id, fetching it on a miss. While
// the registry is unreachable, or does not know the id for less than the
// lookup timeout, it asks again with backoff (never more often than the
// backoff, whatever the number of records waiting) until ctx ends: then
// the error wraps ErrRetry and the record waits. An id still unknown after
// the lookup timeout is an error (a dead letter), remembered for a while.
func (c *avroCache) get(ctx context.Context, id schemaRef, envelope bool) (*avroSchema, error) {
	c.mu.Lock()
	s := c.m[id]
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	if c.reg == nil {
		return nil, errors.New("no schema_registry is configured")
	}
	if _, ok := c.reg.(GlobalRegistry); id.global && !ok {
		return nil, fmt.Errorf("%s: the registry serves no Apicurio global ids (set schema_registry.kind: apicurio)", id)
	}
	for {
		c.mu.Lock()
		m := c.misses[id]
		c.mu.Unlock()
		if m != nil && time.Now().Before(m.next) {
			if m.dead != nil {
				return nil, m.dead
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("%s: %s: %w", id, m.why, ErrRetry)
			case <-time.After(time.Until(m.next)):
			}
			continue
		}
		sch, err := fetch(ctx, c.reg, id)
		if err == nil {
			s = buildAvro(sch, envelope)
			c.mu.Lock()
			c.m[id] = s
			delete(c.misses, id)
			c.mu.Unlock()
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("fetching %s: %w (%w)", id, ErrRetry, err)
		}
		var re *sr.ResponseError
		unknown := errors.As(err, &re) && (re.StatusCode == http.StatusNotFound || re.ErrorCode == 40403)
		now := time.Now()
		c.mu.Lock()
		if m = c.misses[id]; m == nil {
			m = &miss{backoff: registryBackoffMin}
			c.misses[id] = m
		}
		// The lookup timeout counts from the first "not known" answer of
		// an uninterrupted run of them: an outage before does not count.
		switch {
		case !unknown:
			m.first = time.Time{}
		case m.first.IsZero():
			m.first = now
		}
		if unknown && now.Sub(m.first) >= c.lookupTimeout {
			m.dead = fmt.Errorf("%s is not in the schema registry (asked for %s): %w", id, now.Sub(m.first).Round(time.Second), err)
			m.next = now.Add(unknownTTL)
			c.mu.Unlock()
			return nil, m.dead
		}
		m.dead = nil
		m.why = "the registry is unreachable or refusing: " + err.Error()
		if unknown {
			m.why = fmt.Sprintf("the registry does not know it yet (asked for %s of schema_registry.lookup_timeout %s)", now.Sub(m.first).Round(time.Second), c.lookupTimeout)
		}
		m.next = now.Add(m.backoff/2 + rand.N(m.backoff/2+1))
		m.backoff = min(2*m.backoff, registryBackoffMax)
		warn := now.Sub(c.warned) > 30*time.Second
		if warn {
			c.warned = now
		}
		c.mu.Unlock()
		if warn {
			what := "schema registry unreachable or refusing; records wait and are retried"
			if unknown {
				what = "the schema registry does not know a schema id yet (a follower behind?); records wait and are retried until schema_registry.lookup_timeout"
			}
			c.log.Warn(what, zap.Stringer("schema", id), zap.Error(err))
		}
	}
}

func buildAvro(sch sr.Schema, envelope bool) *avroSchema {
	if sch.Type != sr.TypeAvro {
		return &avroSchema{err: fmt.Errorf("schema is %s, not Avro", sch.Type)}
	}
	root, stripped, err := fromAvro(sch.Schema)
	if err != nil {
		return &avroSchema{err: err}
	}
	codec, err := goavro.NewCodec(stripped)
	if err != nil {
		return &avroSchema{err: fmt.Errorf("avro schema: %w", err)}
	}
	out := &avroSchema{codec: codec, root: root}
	rs := root
	if envelope {
		if rs = root.field("after"); rs == nil {
			rs = root.field("before")
		}
	}
	if rs != nil && rs.Type == "struct" {
		if out.row, err = newRowSchema(rs, envelope && binlogSource(root)); err != nil {
			out.err = err
		}
	}
	if envelope && out.row != nil && !avroWhole {
		out.plan = newAvroPlan(stripped, len(out.row.cols))
	}
	return out
}

// decodeRecord decodes an Avro record (a key, or an envelope) with its
// writer schema, found as frame says. ok is false for a key that is not
// Avro. An envelope its schema's plan reads, unless whole, (avroplan.go) comes without
// before, and with its after image as the row's values (after; nil for
// none); any other record comes as goavro decodes it, after nil.
func (d *Decoder) decodeRecord(ctx context.Context, b []byte, hs []Header, key, whole bool) (s *avroSchema, rec map[string]any, after []any, ok bool, err error) {
	id, body, ok, err := d.frame(b, hs, key)
	if !ok || err != nil {
		return nil, nil, nil, ok, err
	}
	if s, err = d.avro.get(ctx, id, !key); err != nil {
		return nil, nil, nil, true, err
	}
	if s.err != nil {
		return nil, nil, nil, true, fmt.Errorf("%s: %w", id, s.err)
	}
	if s.plan != nil && !key && !whole {
		if rec, after, err = s.plan.decode(body, s.row); err != nil {
			return nil, nil, nil, true, fmt.Errorf("avro record (%s): %w", id, err)
		}
		return s, rec, after, true, nil
	}
	native, rest, err := s.codec.NativeFromBinary(body)
	if err != nil {
		return nil, nil, nil, true, fmt.Errorf("avro record (%s): %w", id, err)
	}
	if len(rest) != 0 {
		return nil, nil, nil, true, fmt.Errorf("avro record (%s): %d bytes left over", id, len(rest))
	}
	if rec, ok = native.(map[string]any); !ok {
		return nil, nil, nil, true, fmt.Errorf("avro value (%s) is not a record", id)
	}
	return s, rec, nil, true, nil
}

// unwrapUnion takes a value out of goavro's union wrapper {"type": value}.
func unwrapUnion(v any) any {
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for _, x := range m {
			return x
		}
	}
	return v
}

// avroPath follows a path of field names through a decoded record, taking
// values out of their unions as the schema says.
func avroPath(s *Schema, rec map[string]any, path []string) (any, *Schema) {
	var cur any = rec
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok || s == nil {
			return nil, nil
		}
		if s = s.field(p); s == nil {
			return nil, nil
		}
		cur = m[p]
		if s.union {
			cur = unwrapUnion(cur)
		}
	}
	return cur, s
}

func (d *Decoder) decodeAvro(ctx context.Context, r *rule, o change.Origin, key, value []byte, hs []Header) (*change.Event, error) {
	if len(value) == 0 {
		return nil, ErrSkip // tombstone
	}
	s, rec, planned, _, err := d.decodeRecord(ctx, value, hs, false, r.images)
	if err != nil {
		return nil, fmt.Errorf("value: %w", err)
	}
	opv, _ := avroPath(s.root, rec, []string{"op"})
	opStr, ok := opv.(string)
	if !ok {
		if s.root.field("op") == nil && s.root.field("ts_ms") != nil {
			return nil, ErrSkip // a heartbeat
		}
		if st, _ := avroPath(s.root, rec, []string{"status"}); (st == "BEGIN" || st == "END") && s.root.field("id") != nil {
			return nil, ErrSkip // transaction metadata, from a topic a pattern took
		}
		if s.root.field("tableChanges") != nil || s.root.field("ddl") != nil {
			return nil, ErrSkip // a schema change, from a topic a pattern took
		}
		if d.wire != ConfluentIDs {
			// Ids of the wrong kind name other schemas (a key's, another
			// table's): the likeliest cause under Apicurio.
			return nil, fmt.Errorf("envelope has no op field (its writer schema is %s: does schema_registry.use_id match the converter's apicurio.registry.use-id?)", s.root.Name)
		}
		return nil, errors.New("envelope has no op field")
	}
	op, err := change.ParseOp(opStr)
	if err != nil {
		return nil, err
	}
	ev := &change.Event{Table: r.Target, Op: op, Origin: o}
	conn, _ := avroPath(s.root, rec, []string{"source", "connector"})
	fromMongo := conn == "mongodb"
	var doc *rowSchema // a MongoDB document's fields
	ev.Source = r.connector(func() string {
		v, _ := avroPath(s.root, rec, sourceName)
		name, _ := v.(string)
		v, _ = avroPath(s.root, rec, sourceDB)
		db, _ := v.(string)
		return sourceKey(name, db)
	})
	if r.TransactionTopic != "" {
		ev.Txn = avroTxnMark(r, s.root, rec)
		d.noteTxn(r, ev)
	}
	if s.row != nil {
		ev.Row = s.row
	}
	seq := make([]byte, 0, 12*len(r.seqPaths))
	for i, p := range r.seqPaths {
		v, _ := avroPath(s.root, rec, p)
		if str, ok := v.(string); ok && r.gtid[i] {
			if seq, err = d.gtidPart(r, seq, str); err != nil {
				return nil, fmt.Errorf("sequence path %s %w", r.SequenceBy[i], err)
			}
		} else if seq, err = appendAvroSeq(seq, v); err != nil {
			if errors.Is(err, errMissing) && op == change.OpRead {
				seq = nil // an incremental-snapshot read: the consumer anchors it
				break
			}
			return nil, fmt.Errorf("sequence path %s %w", r.SequenceBy[i], err)
		}
	}
	ev.Seq = seq
	if op == change.OpRead && seq != nil {
		snap, _ := avroPath(s.root, rec, sourceSnapshot)
		str, _ := snap.(string)
		ev.SnapshotEnd = snapshotEnd(str)
	}
	if op.HasAfter() {
		after, _ := avroPath(s.root, rec, []string{"after"})
		m, ok := after.(map[string]any)
		if str, isStr := after.(string); isStr && fromMongo { // a MongoDB document (mongo.go)
			if doc, ev.AfterValues, err = r.docs.mongoDocument(str); err != nil {
				return nil, fmt.Errorf("%s event: after document: %w", opStr, err)
			}
			ev.Row, ev.Complete = doc, true
		} else if planned != nil {
			ev.AfterValues = planned
		} else if !ok || s.row == nil {
			if fromMongo {
				return nil, fmt.Errorf("%s event without the document (after): with capture.mode change_streams, updates carry only "+
					"updateDescription; use change_streams_update_full (docs/sources.md)", opStr)
			}
			return nil, fmt.Errorf("%s event: no after image", opStr)
		} else if ev.AfterValues, err = s.row.nativeValues(m); err != nil {
			return nil, fmt.Errorf("%s event: %w", opStr, err)
		}
	}
	if doc != nil && r.imageTime() {
		ev.ValidFrom, err = docTime(r, doc, ev.AfterValues)
	} else {
		ev.ValidFrom, err = avroValidFrom(r, s, rec, &ev.TimeStandIn)
	}
	if err != nil {
		return nil, err
	}
	ev.PackAfterValues() // compact while it waits in the buffer (digested first, with its time)
	if op == change.OpTruncate {
		return ev, nil
	}
	keys := r.Keys
	if fromMongo && len(keys) == 1 && keys[0] == "_id" {
		keys = nil // the message key's id is the _id
	}
	full := func() (map[string]any, error) { return rec, nil }
	if s.plan != nil && !r.images {
		// The plan left the images out of rec: a key column taken from
		// them (no message key, or one without it) needs the whole record.
		full = func() (map[string]any, error) {
			_, whole, _, _, err := d.decodeRecord(ctx, value, hs, false, true)
			return whole, err
		}
	}
	if ev.Key, ev.KeyNames, err = d.avroKey(ctx, r, keys, key, hs, s, full); err != nil {
		return nil, err
	}
	if fromMongo && len(ev.Key) == 1 && len(ev.KeyNames) == 1 && ev.KeyNames[0] == "id" {
		id, ok := ev.Key[0].(string)
		if !ok {
			return nil, fmt.Errorf(`message key: a MongoDB key's "id" is a %T, not the _id as JSON`, ev.Key[0])
		}
		ev.Key, ev.KeyNames = []any{mongo.KeyText(id)}, mongo.KeyNames
	}
	return ev, nil
}

// nativeValues decodes a goavro record into typed values, as DecodeRow
// does for JSON, in the schema's column order (change.Event.AfterValues):
// the record's schema is the row's, so it carries every column.
func (r *rowSchema) nativeValues(m map[string]any) ([]any, error) {
	out := make([]any, len(r.cols))
	for i, c := range r.cols {
		v, ok := m[c.name]
		if !ok {
			return nil, fmt.Errorf("column %s is missing from the record", c.name)
		}
		val, err := c.native(v)
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", c.name, err)
		}
		out[i] = val
	}
	return out, nil
}

func appendAvroSeq(seq []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case int64:
		return change.AppendSeqInt(seq, x), nil
	case int32:
		return change.AppendSeqInt(seq, int64(x)), nil
	case string:
		if t := strings.TrimSpace(x); len(t) > 0 && t[0] == '[' && gjson.Valid(t) {
			return appendSeqArray(seq, gjson.Parse(t))
		}
		return change.AppendSeqText(seq, x), nil
	case nil:
		return nil, errMissing
	}
	return nil, fmt.Errorf("is a %T, not a number or string", v)
}

func avroValidFrom(r *rule, s *avroSchema, rec map[string]any, standIn *bool) (time.Time, error) {
	v, _ := avroPath(s.root, rec, r.vfPath)
	if v == nil {
		if a, _ := avroPath(s.root, rec, r.vfPath[:1]); r.imageTime() && a == nil {
			// A delete: no row to take the time from.
			if ms, _ := avroPath(s.root, rec, sourceTsMs); ms != nil {
				if ms, ok := ms.(int64); ok {
					*standIn = true
					return time.UnixMilli(ms).UTC(), nil
				}
			}
		}
		return time.Time{}, fmt.Errorf("valid_from path %s is missing", r.ValidFrom)
	}
	if len(r.vfPath) == 2 && (r.vfPath[0] == "after" || r.vfPath[0] == "before") && s.row != nil {
		if c := s.row.byName[r.vfPath[1]]; c != nil {
			tv, err := c.native(v)
			if t, ok := tv.(time.Time); ok && err == nil {
				return t, nil
			}
			return time.Time{}, fmt.Errorf("valid_from %s is a %s column, not a time", r.ValidFrom, c.pgType)
		}
	}
	switch x := v.(type) {
	case int64:
		return r.epochTime(x), nil
	case string:
		return r.isoTime(x)
	}
	return time.Time{}, fmt.Errorf("valid_from %s: a %T is not a time", r.ValidFrom, v)
}

// avroKey reads the key: an Avro record (wire format, or bare with
// Apicurio's key header) or JSON, as the key converter wrote it;
// configured key columns may come from the row images instead.
func (d *Decoder) avroKey(ctx context.Context, r *rule, keys []string, raw []byte, hs []Header, s *avroSchema, full func() (map[string]any, error)) ([]any, []string, error) {
	var names []string
	var vals []any
	var kerr error
	ks, krec, _, isAvro, err := d.decodeRecord(ctx, raw, hs, true, true)
	if isAvro {
		if errors.Is(err, ErrRetry) {
			return nil, nil, err
		}
		if err == nil && ks.row != nil {
			for _, c := range ks.row.cols {
				v, err := c.native(krec[c.name])
				if err != nil {
					return nil, nil, fmt.Errorf("message key: column %s: %w", c.name, err)
				}
				vals = append(vals, v)
			}
			names = ks.row.names // shared: no allocation per event
		} else if err == nil {
			kerr = errors.New("key is not an Avro record")
		} else {
			kerr = err
		}
	} else {
		fields, ks, err := d.keyFields(nil, raw, &r.lastKey)
		kerr = err
		for _, f := range fields {
			v, err := typed(ks, f.name, f.v)
			if err != nil {
				return nil, nil, fmt.Errorf("message key: %w", err)
			}
			names, vals = append(names, strings.Clone(f.name)), append(vals, v)
		}
	}
	if len(keys) == 0 {
		if kerr != nil {
			return nil, nil, fmt.Errorf("message key: %w", kerr)
		}
		if len(names) == 0 {
			return nil, nil, errors.New("message has no key and the table configures no keys")
		}
		return vals, names, nil
	}
	out := make([]any, len(keys))
	var rec map[string]any // the whole record, read when a key column is not in the message key
	for i, k := range keys {
		var v any
		for j, n := range names {
			if n == k {
				v = vals[j]
			}
		}
		if v == nil && s.row != nil && rec == nil {
			var err error
			if rec, err = full(); err != nil {
				return nil, nil, fmt.Errorf("value: %w", err)
			}
		}
		for _, img := range []string{"before", "after"} {
			if v != nil || s.row == nil {
				break
			}
			if c := s.row.byName[k]; c != nil {
				if raw, _ := avroPath(s.root, rec, []string{img, k}); raw != nil {
					var err error
					if v, err = c.native(raw); err != nil {
						return nil, nil, fmt.Errorf("key column %s: %w", k, err)
					}
				}
			}
		}
		if v == nil {
			return nil, nil, fmt.Errorf("key column %s is missing", k)
		}
		out[i] = v
	}
	return out, keys, nil
}
