package debezium

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/scd2sink/scd2sink/debezium/jsonscan"
	"github.com/scd2sink/scd2sink/debezium/mongo"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

// envelopeSchema is the parsed value schema of a Debezium envelope.
type envelopeSchema struct {
	row  *rowSchema // the before/after struct; nil when the schema has none
	flat bool       // a flattened record's schema (flat.go): row is the record's
	// added are the fields a flattened record's transform added (flat.go):
	// the trailing run of its schema's fields named as it names them.
	added map[string]bool
}

// flatKind says how a payload is read: an envelope, or a flattened record
// (flat.go) with or without its row.
type flatKind uint8

const (
	notFlat    flatKind = iota
	flatRow             // a flattened create, update or read: the payload is the row
	flatDelete          // a flattened delete (__deleted): the payload is the old row
)

// jsonEnvelope is the payload of one record, its top-level fields read in
// one pass (Get would scan the payload again for each).
type jsonEnvelope struct {
	payload gjson.Result
	schema  *envelopeSchema // nil without a schema
	top     members
	// The members of the last nested object a two-part path went through
	// (in practice "source": its name, database, sequence, snapshot flag
	// and time are each read), taken in one pass instead of a scan per
	// field.
	sub     members
	subName string // the top-level field they belong to; "" when none is read
	flat    flatKind
}

// members are an object's members, taken in one pass, strings left
// escaped until read (jsonscan.ForEachMemberLazy).
type members struct {
	names  [24]string
	values [24]gjson.Result
	n      int
	full   bool // the object has more members than were taken
}

// read takes the members of the object raw, a part of a validated payload.
func (m *members) read(raw string) {
	m.n, m.full = 0, false
	jsonscan.ForEachMemberLazy(raw, func(k string, v gjson.Result) bool {
		if m.n == len(m.names) {
			m.full = true
			return false
		}
		m.names[m.n], m.values[m.n] = k, v
		m.n++
		return true
	})
}

// get returns the member name of obj (whose members m holds) as
// obj.Get(escapePath(name)) would: the first of equal names, its string
// unescaped and its number parsed.
func (m *members) get(obj gjson.Result, name string) gjson.Result {
	for i := 0; i < m.n; i++ {
		if m.names[i] == name {
			return withNum(jsonscan.Unescaped(m.values[i]))
		}
	}
	if m.full {
		return obj.Get(escapePath(name))
	}
	return gjson.Result{}
}

// read takes the payload's top-level fields.
func (e *jsonEnvelope) read(payload gjson.Result, schema *envelopeSchema) {
	e.payload, e.schema, e.subName, e.flat = payload, schema, "", notFlat
	e.top.read(payload.Raw) // validated by unwrapJSON
}

// field returns a top-level field of the payload, as gjson's Get would.
func (e *jsonEnvelope) field(name string) gjson.Result { return e.top.get(e.payload, name) }

// get follows an envelope path (field names taken literally, not as
// gjson's path syntax).
func (e *jsonEnvelope) get(path []string) gjson.Result {
	if len(path) == 0 {
		return gjson.Result{}
	}
	if e.flat != notFlat {
		return e.flatGet(path)
	}
	v := e.field(path[0])
	if len(path) == 2 && v.IsObject() {
		if e.subName != path[0] || path[0] == "" {
			e.subName = path[0]
			e.sub.read(v.Raw)
		}
		return e.sub.get(v, path[1])
	}
	for _, p := range path[1:] {
		if !v.IsObject() {
			return gjson.Result{}
		}
		v = v.Get(escapePath(p))
	}
	return v
}

// withNum parses a number's Num, as gjson does (ForEachMember leaves it 0).
func withNum(v gjson.Result) gjson.Result {
	if v.Type == gjson.Number {
		v.Num, _ = strconv.ParseFloat(v.Raw, 64)
	}
	return v
}

// bytesString views b as a string without copying; the string must not
// outlive b's use in this call.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// isSpace reports JSON whitespace.
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func trimSpace(s string) string {
	for len(s) > 0 && isSpace(s[0]) {
		s = s[1:]
	}
	for len(s) > 0 && isSpace(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

// unwrapJSON splits a JsonConverter message into its payload and the parsed
// schema (from the cache); a message without a schema is its own payload.
// Everything it returns is validated JSON. A null payload returns ok=false.
//
// last remembers the schema of the previous message of the same stream:
// when a message is exactly {"schema":<that text>,"payload":...}, as the
// JsonConverter writes it, only the payload needs reading.
func (d *Decoder) unwrapJSON(s string, parse func(string) *cached, last *atomic.Pointer[cached]) (payload gjson.Result, schema *cached, ok bool, err error) {
	if s == "" || s[0] != '{' {
		return payload, nil, false, errors.New("not a JSON object")
	}
	if c := last.Load(); c != nil {
		if p, hit := samePrefix(s, c.raw); hit {
			if !gjson.Valid(p) {
				return payload, nil, false, errors.New("not valid JSON")
			}
			if p == "null" {
				return payload, c, false, nil
			}
			return gjson.Parse(p), c, true, nil
		}
	}
	defer func() {
		if schema != nil {
			last.Store(schema)
		}
	}()
	var schemaRes, payloadRes gjson.Result
	n := 0
	gjson.Parse(s).ForEach(func(k, v gjson.Result) bool {
		n++
		switch k.Str {
		case "schema":
			schemaRes = v
		case "payload":
			payloadRes = v
		}
		return n <= 2
	})
	if n != 2 || !schemaRes.Exists() || !payloadRes.Exists() || !spansOK(s, schemaRes, payloadRes) {
		// No schema: the message is the payload.
		if !gjson.Valid(s) {
			return payload, nil, false, errors.New("not valid JSON")
		}
		return gjson.Parse(s), nil, true, nil
	}
	// The schema text was validated when it entered the cache; the
	// payload and the skeleton around the two are validated here.
	if !gjson.Valid(payloadRes.Raw) || !skeletonValid(s, schemaRes, payloadRes) {
		return payload, nil, false, errors.New("not valid JSON")
	}
	if schemaRes.Type == gjson.Null {
		schema = nil
	} else {
		schema = d.schemas.get(schemaRes.Raw, parse)
	}
	if payloadRes.Type == gjson.Null {
		return payload, schema, false, nil
	}
	return payloadRes, schema, true, nil
}

// samePrefix returns the payload text of s when s is exactly
// {"schema":<schema>,"payload":<payload>}.
func samePrefix(s, schema string) (string, bool) {
	const head, mid = `{"schema":`, `,"payload":`
	if len(s) < len(head)+len(schema)+len(mid)+1 || s[:len(head)] != head || s[len(head):len(head)+len(schema)] != schema {
		return "", false
	}
	rest := s[len(head)+len(schema):]
	if rest[:len(mid)] != mid || rest[len(rest)-1] != '}' {
		return "", false
	}
	return rest[len(mid) : len(rest)-1], true
}

// spansOK reports whether the results' raw spans lie inside s where gjson
// says they do (they do for any input that parses).
func spansOK(s string, rs ...gjson.Result) bool {
	for _, r := range rs {
		if r.Index <= 0 || r.Index+len(r.Raw) > len(s) || s[r.Index:r.Index+len(r.Raw)] != r.Raw {
			return false
		}
	}
	return true
}

// skeletonValid validates s with the two values replaced by 0: what
// remains must be an object of exactly those two members.
func skeletonValid(s string, a, b gjson.Result) bool {
	if a.Index > b.Index {
		a, b = b, a
	}
	if a.Index+len(a.Raw) > b.Index {
		return false
	}
	var buf [256]byte
	sk := buf[:0]
	sk = append(sk, s[:a.Index]...)
	sk = append(sk, '0')
	sk = append(sk, s[a.Index+len(a.Raw):b.Index]...)
	sk = append(sk, '0')
	sk = append(sk, s[b.Index+len(b.Raw):]...)
	return gjson.ValidBytes(sk)
}

// parseEnvelopeSchema parses a value schema for the cache.
func parseEnvelopeSchema(raw string) *cached {
	if !gjson.Valid(raw) {
		return &cached{err: errors.New("schema is not valid JSON")}
	}
	s, err := parseSchema([]byte(raw))
	if err != nil {
		return &cached{err: err}
	}
	env := &envelopeSchema{}
	rs := flatRowSchema(s) // a flattened record's (flat.go), or nil
	env.flat = rs != nil
	if env.flat {
		env.added = map[string]bool{}
		for _, f := range s.Fields[len(rs.Fields):] {
			env.added[f.Field] = true
		}
	}
	if rs == nil {
		if rs = s.field("after"); rs == nil {
			rs = s.field("before")
		}
	}
	if rs != nil && rs.Type == "string" { // MongoDB: documents as Extended JSON strings (mongo.go)
		rs = nil
	}
	if rs != nil {
		if env.row, err = newRowSchema(rs, binlogSource(s)); err != nil {
			return &cached{err: fmt.Errorf("schema of %s: %w", s.Name, err)}
		}
	}
	return &cached{env: env}
}

// parseKeySchema parses a key schema for the cache.
func parseKeySchema(raw string) *cached {
	if !gjson.Valid(raw) {
		return &cached{err: errors.New("key schema is not valid JSON")}
	}
	s, err := parseSchema([]byte(raw))
	if err != nil {
		return &cached{err: err}
	}
	row, err := newRowSchema(s, false)
	if err != nil {
		return &cached{err: fmt.Errorf("key schema: %w", err)}
	}
	return &cached{row: row}
}

func (d *Decoder) decodeJSON(r *rule, o change.Origin, key, value []byte) (*change.Event, error) {
	s := trimSpace(bytesString(value))
	if s == "" || s == "null" {
		return nil, ErrSkip // tombstone
	}
	payload, sc, ok, err := d.unwrapJSON(s, parseEnvelopeSchema, &r.lastValue)
	if err != nil {
		return nil, fmt.Errorf("value is not Debezium JSON: %w", err)
	}
	if sc != nil && sc.err != nil {
		return nil, fmt.Errorf("value schema: %w", sc.err)
	}
	if !ok {
		return nil, ErrSkip // a null payload is a tombstone too
	}
	if !payload.IsObject() {
		return nil, errors.New("value is not Debezium JSON: payload is not an object")
	}
	var es *envelopeSchema
	if sc != nil {
		es = sc.env
	}
	var env jsonEnvelope
	env.read(payload, es)
	return d.fromEnvelope(r, o, key, &env)
}

// escapePath escapes gjson's path syntax in a literal field name.
func escapePath(p string) string {
	if !strings.ContainsAny(p, `.*?|#@\!=<>%"`) {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if strings.IndexByte(`.*?|#@\!=<>%"`, p[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

func (d *Decoder) fromEnvelope(r *rule, o change.Origin, key []byte, env *jsonEnvelope) (*change.Event, error) {
	var op gjson.Result
	if env.looksFlat() {
		var err error
		if op, err = env.flatOp(); err != nil {
			return nil, err
		}
	} else {
		op = env.field("op")
	}
	if !op.Exists() || op.Type == gjson.Null {
		if env.field("ts_ms").Exists() && env.top.n <= 2 {
			return nil, ErrSkip // a heartbeat: {"ts_ms": ...}
		}
		if st := env.field("status").Str; (st == "BEGIN" || st == "END") && env.field("id").Exists() {
			return nil, ErrSkip // transaction metadata, from a topic a pattern took
		}
		if env.field("tableChanges").Exists() || env.field("ddl").Exists() {
			return nil, ErrSkip // a schema change, from a topic a pattern took
		}
		return nil, errors.New("envelope has no op field (a record flattened by ExtractNewRecordState or ExtractNewDocumentState needs " +
			"add.fields=op,… and delete.tombstone.handling.mode=rewrite; docs/sources.md, flattened records)")
	}
	if op.Type != gjson.String {
		return nil, fmt.Errorf("unknown operation %s", clip(op.Raw))
	}
	opv, err := change.ParseOp(op.Str)
	if err != nil {
		return nil, err
	}
	ev := &change.Event{Table: r.Target, Op: opv, Origin: o}
	ev.Source = r.connector(func() string { return sourceKey(env.get(sourceName).Str, env.get(sourceDB).Str) })
	if r.TransactionTopic != "" {
		ev.Txn = env.txnMark(r)
		d.noteTxn(r, ev)
	}
	var seqBuf [64]byte
	seq := seqBuf[:0]
	for i, p := range r.seqPaths {
		if v := env.get(p); r.gtid[i] && v.Type == gjson.String {
			if seq, err = d.gtidPart(r, seq, v.Str); err != nil {
				return nil, fmt.Errorf("sequence path %s %w", r.SequenceBy[i], err)
			}
		} else if seq, err = appendSeq(seq, v); err != nil {
			if errors.Is(err, errMissing) && opv == change.OpRead {
				seq = nil // an incremental-snapshot read: the consumer anchors it
				break
			}
			return nil, fmt.Errorf("sequence path %s %w", r.SequenceBy[i], err)
		}
	}
	if opv == change.OpRead && seq != nil {
		ev.SnapshotEnd = snapshotEnd(env.get(sourceSnapshot).Str)
	}
	var row *rowSchema
	if env.schema != nil {
		row = env.schema.row
	}
	var after string
	var doc *rowSchema // a MongoDB document's fields
	fromMongo := isMongo(env)
	if env.flat != notFlat {
		fromMongo = false // a flattened document is a row (flat.go)
	}
	if opv.HasAfter() && env.flat == flatRow {
		var added map[string]bool
		if env.schema != nil {
			added = env.schema.added
		}
		if after, err = flatAfter(env.payload, added); err != nil {
			return nil, fmt.Errorf("%s event: %w", op.Str, err)
		}
		ev.AfterValid = true
		ev.Complete = r.Connector == "mongodb"
	} else if opv.HasAfter() && fromMongo {
		a := env.field("after")
		if a.Type != gjson.String {
			return nil, fmt.Errorf("%s event without the document (after): with capture.mode change_streams, updates carry only "+
				"updateDescription; use change_streams_update_full (docs/sources.md)", op.Str)
		}
		rs, vals, err := r.docs.mongoDocument(a.Str)
		if err != nil {
			return nil, fmt.Errorf("%s event: after document: %w", op.Str, err)
		}
		doc, ev.Row, ev.AfterValues, ev.Complete = rs, rs, vals, true
	} else if opv.HasAfter() {
		a := env.field("after")
		if !a.IsObject() {
			if a.Exists() && a.Type != gjson.Null {
				return nil, fmt.Errorf("%s event: after image is not a JSON object", op.Str)
			}
			return nil, fmt.Errorf("%s event: no after image", op.Str)
		}
		after = a.Raw
		ev.AfterValid = true // unwrapJSON validated the payload
	}
	if row != nil && !fromMongo {
		ev.Row = row
	}
	if doc != nil && r.imageTime() {
		ev.ValidFrom, err = docTime(r, doc, ev.AfterValues)
	} else {
		ev.ValidFrom, err = validFrom(r, env, row, &ev.TimeStandIn)
	}
	if err != nil {
		return nil, err
	}
	var idBuf [64]byte
	id := idBuf[:0]
	switch {
	case opv == change.OpTruncate:
	case env.flat != notFlat && r.Connector == "mongodb":
		if ev.Key, err = flatDocumentKey(key, env); err != nil {
			return nil, err
		}
		ev.KeyNames = mongo.KeyNames
		id = change.AppendKeyID(id, ev.Key)
	case fromMongo && (len(r.Keys) == 0 || (len(r.Keys) == 1 && r.Keys[0] == "_id")):
		k, err := mongo.Key(keyPayload(key))
		if err != nil {
			return nil, err
		}
		ev.Key, ev.KeyNames = []any{k}, mongo.KeyNames
		id = change.AppendKeyID(id, ev.Key)
	default:
		if ev.Key, ev.KeyNames, err = d.keyOf(ev, r, key, env, row); err != nil {
			return nil, err
		}
		id = change.AppendKeyID(id, ev.Key)
	}
	// The image, the sequence and the key's identity share one
	// allocation: all three live as long as the event, and none is
	// written again.
	buf := make([]byte, 0, len(after)+len(seq)+len(id))
	buf = append(append(append(buf, after...), seq...), id...)
	if opv.HasAfter() {
		ev.AfterJSON = buf[:len(after):len(after)]
	}
	if seq != nil {
		n := len(after) + len(seq)
		ev.Seq = buf[len(after):n:n]
	}
	if len(id) > 0 {
		ev.SetKeyID(unsafe.String(&buf[len(after)+len(seq)], len(id)))
	}
	return ev, nil
}
