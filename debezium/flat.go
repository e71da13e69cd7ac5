package debezium

import (
	"errors"
	"strings"

	"github.com/scd2sink/scd2sink/debezium/mongo"
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
// flattened when it has __op or __deleted and no source block; it must
// carry __op (add.fields=op,…): a create, a snapshot read and an update
// are told apart by nothing else. Its operation is __op (a delete when
// __deleted), its image the payload without the fields the transform added,
// and an envelope path the
// configuration names (sequence_by, valid_from) is looked up as the field
// add.fields made of it. after.<column> is the row's column (before.<column>
// a deleted row's). A plain tombstone, which the transform's default delete
// mode writes, carries no sequence: it is skipped as tombstones are, so
// such deletes do not reach the history — set the rewrite mode.
//
// Which fields the transform added: it builds the new value from the row's
// fields, then appends add.fields' and __deleted (in schema order, which
// the JsonConverter keeps with and without schemas). So the added fields
// are the trailing run of fields named as the transform names them
// (flatAdded): a row's own column of such a name (__version, __table) is
// the row's when a column of the row follows it. Only a row whose last
// columns are named like the transform's fields loses them.

// looksFlat says whether a payload is a flattened record's; its schema,
// when there is one, has said so already.
func (e *jsonEnvelope) looksFlat() bool {
	if e.schema != nil {
		return e.schema.flat
	}
	return (e.field("__op").Exists() || e.field("__deleted").Exists()) && !e.field("source").IsObject()
}

// flatRowSchema is the row schema of a flattened record's value schema:
// its fields but those the transform added; nil when s is not one.
func flatRowSchema(s *Schema) *Schema {
	if s == nil || s.Type != "struct" || (s.field("__op") == nil && s.field("__deleted") == nil) {
		return nil
	}
	if src := s.field("source"); src != nil && src.Type == "struct" {
		return nil // an envelope with a column of that name
	}
	row := *s
	n := len(s.Fields)
	for n > 0 && flatAdded(s.Fields[n-1].Field) {
		n--
	}
	row.Fields = s.Fields[:n:n]
	return &row
}

// addedBare are the fields add.fields names unqualified (op → __op, lsn →
// __lsn): the envelope's own, the connectors' source fields, the
// transaction block's.
var addedBare = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`op ts_ms ts_us ts_ns version connector name snapshot db sequence schema table
		txId lsn xmin change_lsn commit_lsn event_serial_no server_id gtid file pos row thread query scn commit_scn rs_id ssn
		redo_thread user_name lcr_position collection ord lsid txnNumber wallTime id total_order data_collection_order`) {
		addedBare[f] = true
	}
}

// flatAdded says whether a flattened record's field is one the transform
// added, not the row's.
func flatAdded(name string) bool {
	rest, ok := strings.CutPrefix(name, "__")
	if !ok {
		return false
	}
	return rest == "deleted" || addedBare[rest] || strings.HasPrefix(rest, "source_") ||
		strings.HasPrefix(rest, "transaction_") || strings.HasPrefix(rest, "updateDescription")
}

// bareStruct is the envelope block add.fields takes an unqualified name
// from (Debezium's FieldReference.determineStruct): "" for the envelope's
// own fields.
func bareStruct(field string) string {
	switch field {
	case "id", "total_order", "data_collection_order":
		return "transaction"
	case "op", "ts_ms", "ts_us", "ts_ns":
		return ""
	case "updateDescription":
		return "updateDescription"
	}
	return "source"
}

// flatOp reads a flattened record's operation and marks e flattened.
func (e *jsonEnvelope) flatOp() (gjson.Result, error) {
	op, del := e.field("__op"), e.field("__deleted")
	if op.Type != gjson.String {
		return gjson.Result{}, errors.New("flattened record without __op: add op to the transform's add.fields " +
			"(a create, an update and a snapshot read differ in nothing else; docs/sources.md, flattened records)")
	}
	if del.Type == gjson.True || (del.Type == gjson.String && del.Str == "true") || op.Str == "d" {
		e.flat = flatDelete
		return gjson.Result{Type: gjson.String, Str: "d", Raw: `"d"`}, nil
	}
	e.flat = flatRow
	return op, nil
}

// flatGet follows an envelope path through a flattened record.
func (e *jsonEnvelope) flatGet(path []string) gjson.Result {
	switch {
	case len(path) == 2 && (path[0] == "after" || path[0] == "before"):
		if (path[0] == "after") == (e.flat == flatRow) {
			return e.field(path[1])
		}
		return gjson.Result{}
	case len(path) == 1 && strings.HasPrefix(path[0], "__"):
		return e.field(path[0]) // a field named as the transform wrote it
	case len(path) == 1:
		return e.field("__" + path[0])
	}
	if v := e.field("__" + strings.Join(path, "_")); v.Exists() {
		return v
	}
	if len(path) == 2 && bareStruct(path[1]) == path[0] {
		return e.field("__" + path[1]) // add.fields named it unqualified
	}
	return gjson.Result{}
}

// flatAfter is a flattened record's row: the payload without the fields
// the transform added, added when its schema has named them, else the
// trailing run of fields flatAdded accepts.
func flatAfter(p gjson.Result, added map[string]bool) (string, error) {
	if !p.IsObject() {
		return "", errors.New("flattened record is not a JSON object")
	}
	b := make([]byte, 0, len(p.Raw)+1)
	b = append(b, '{')
	run := -1 // where the trailing run of added-looking fields starts in b
	p.ForEach(func(k, v gjson.Result) bool {
		if added != nil {
			if added[k.Str] {
				return true
			}
		} else if flatAdded(k.Str) {
			if run < 0 {
				run = len(b)
			}
		} else {
			run = -1
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(b, k.Raw...)
		b = append(b, ':')
		b = append(b, v.Raw...)
		return true
	})
	if run >= 0 {
		b = b[:run]
	}
	return string(append(b, '}')), nil
}

// flatRowNames are the names of a flattened row's fields, in order,
// without the transform's trailing run.
func flatRowNames(names []string) []string {
	n := len(names)
	for n > 0 && flatAdded(names[n-1]) {
		n--
	}
	return names[:n]
}

// flatDocumentKey is the _id of a flattened MongoDB record, as text (as
// mongo.IDText spells it): ExtractNewDocumentState's key is {"id": <the
// _id, typed>}; a record without one takes the row's _id.
func flatDocumentKey(raw []byte, env *jsonEnvelope) ([]any, error) {
	id := keyPayload(raw).Get("id")
	if !id.Exists() || id.Type == gjson.Null {
		id = env.field("_id")
	}
	if !id.Exists() || id.Type == gjson.Null {
		return nil, errors.New(`flattened MongoDB record without an id: neither the message key's "id" nor the row's _id`)
	}
	return []any{mongo.IDText(id)}, nil
}
