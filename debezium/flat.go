package debezium

import (
	"errors"
	"strings"

	"github.com/tidwall/gjson"
)

// Flattened records (docs/sources.md, flattened records): Debezium's
// ExtractNewRecordState and, for MongoDB, ExtractNewDocumentState replace
// the envelope with the row itself, and add what add.fields names as
// top-level fields prefixed "__" (op → __op, source.ts_ms →
// __source_ts_ms, an unqualified source field lsn → __lsn,
// transaction.total_order → __transaction_total_order); with
// delete.tombstone.handling.mode=rewrite a delete is the old row with
// __deleted true (a boolean, or the string "true"). A record is read as
// flattened when it has no op but __op or __deleted: its operation is
// __op, else a delete when __deleted, else an update; its image is the
// payload without the "__" fields; and an envelope path the configuration
// names (sequence_by, valid_from) is looked up as the field add.fields made
// of it. after.<column> is the row's column (before.<column> a deleted
// row's). A plain tombstone, which the transform's default delete mode
// writes, carries no sequence: it is skipped as tombstones are, so such
// deletes do not reach the history — set the rewrite mode.

// flatRowSchema is the row schema of a flattened record's value schema:
// its fields but the "__" ones; nil when s is not one.
func flatRowSchema(s *Schema) *Schema {
	if s == nil || s.Type != "struct" || (s.field("__op") == nil && s.field("__deleted") == nil) {
		return nil
	}
	row := *s
	row.Fields = nil
	for _, f := range s.Fields {
		if !strings.HasPrefix(f.Field, "__") {
			row.Fields = append(row.Fields, f)
		}
	}
	return &row
}

// flatOp reads a flattened record's operation and marks e flattened; it
// returns no value for an envelope (nor for a payload without __op and
// __deleted).
func (e *jsonEnvelope) flatOp() gjson.Result {
	op, del := e.field("__op"), e.field("__deleted")
	if !op.Exists() && !del.Exists() {
		return gjson.Result{}
	}
	if del.Type == gjson.True || (del.Type == gjson.String && del.Str == "true") || (op.Type == gjson.String && op.Str == "d") {
		e.flat = flatDelete
		return gjson.Result{Type: gjson.String, Str: "d", Raw: `"d"`}
	}
	e.flat = flatRow
	if op.Type == gjson.String {
		return op
	}
	return gjson.Result{Type: gjson.String, Str: "u", Raw: `"u"`}
}

// flatGet follows an envelope path through a flattened record.
func (e *jsonEnvelope) flatGet(path []string) gjson.Result {
	if len(path) == 2 && (path[0] == "after" || path[0] == "before") {
		if (path[0] == "after") == (e.flat == flatRow) {
			return e.field(path[1])
		}
		return gjson.Result{}
	}
	if len(path) == 1 && !strings.HasPrefix(path[0], "__") {
		if v := e.field("__" + path[0]); v.Exists() {
			return v
		}
	}
	if len(path) == 1 {
		return e.field(path[0]) // a field named as it is written
	}
	if v := e.field("__" + strings.Join(path, "_")); v.Exists() {
		return v
	}
	if len(path) == 2 {
		return e.field("__" + path[1]) // add.fields named it unqualified
	}
	return gjson.Result{}
}

// flatAfter is a flattened record's row: the payload without the fields
// the transform added.
func flatAfter(p gjson.Result) (string, error) {
	if !p.IsObject() {
		return "", errors.New("flattened record is not a JSON object")
	}
	var b strings.Builder
	b.Grow(len(p.Raw))
	b.WriteByte('{')
	n := 0
	p.ForEach(func(k, v gjson.Result) bool {
		if strings.HasPrefix(k.Str, "__") {
			return true
		}
		if n > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k.Raw)
		b.WriteByte(':')
		b.WriteString(v.Raw)
		n++
		return true
	})
	b.WriteByte('}')
	return b.String(), nil
}

// flatDocumentKey is the _id of a flattened MongoDB record, as text (as
// mongoIDText spells it): ExtractNewDocumentState's key is {"id": <the
// _id, typed>}; a record without one takes the row's _id.
func flatDocumentKey(raw []byte, env *jsonEnvelope) ([]any, error) {
	k := gjson.ParseBytes(raw)
	if p := k.Get("payload"); p.IsObject() && k.Get("schema").Exists() {
		k = p
	}
	id := k.Get("id")
	if !id.Exists() || id.Type == gjson.Null {
		id = env.field("_id")
	}
	if !id.Exists() || id.Type == gjson.Null {
		return nil, errors.New(`flattened MongoDB record without an id: neither the message key's "id" nor the row's _id`)
	}
	return []any{mongoIDText(id)}, nil
}
