package debezium

import (
	"context"
	"errors"
	"fmt"

	"github.com/tidwall/gjson"
)

// Description is what one record says of its topic, for `scd2sink init`:
// what kind of record it is, its format, the connector that wrote it, the
// message key's fields and the row's columns.
type Description struct {
	// Kind is data (a change event, enveloped or flattened), heartbeat,
	// transaction (metadata), schema-change, or other (not Debezium's).
	Kind      string
	Format    string // FormatJSON or FormatAvro
	Schemas   bool   // JSON with the JsonConverter's schemas
	Apicurio  bool   // Avro named by Apicurio's headers
	Connector string // source.connector ("" when the record has none)
	Keys      []string
	Columns   []string
}

// Describe reads one record (not a tombstone) of a topic no rule names. An
// Avro record needs the Decoder's registry; its errors are as Decode's.
func (d *Decoder) Describe(ctx context.Context, key, value []byte, headers ...Header) (Description, error) {
	var out Description
	if len(value) == 0 {
		return out, errors.New("a tombstone says nothing of its topic")
	}
	if v := trimSpace(bytesString(value)); len(v) > 0 && v[0] == '{' {
		return describeJSON(key, value)
	}
	out.Format = FormatAvro
	for _, h := range headers {
		if h.Key == ApicurioValueGlobalID || h.Key == ApicurioValueContentID {
			out.Apicurio = true
		}
	}
	s, rec, _, _, err := d.decodeRecord(ctx, value, headers, false, true)
	if err != nil {
		return out, fmt.Errorf("value: %w", err)
	}
	op, _ := avroPath(s.root, rec, []string{"op"})
	switch {
	case op != nil:
		out.Kind = "data"
	case s.root.field("ts_ms") != nil && len(s.root.Fields) <= 2:
		out.Kind = "heartbeat"
	case s.root.field("status") != nil && s.root.field("data_collections") != nil:
		out.Kind = "transaction"
	case s.root.field("ddl") != nil || s.root.field("tableChanges") != nil:
		out.Kind = "schema-change"
	default:
		out.Kind = "other"
	}
	if c, _ := avroPath(s.root, rec, []string{"source", "connector"}); c != nil {
		out.Connector, _ = c.(string)
	}
	if s.row != nil {
		out.Columns = append(out.Columns, s.row.names...)
	}
	ks, _, _, isAvro, err := d.decodeRecord(ctx, key, headers, true, true)
	switch {
	case isAvro && err != nil:
		return out, fmt.Errorf("key: %w", err)
	case isAvro && ks.row != nil:
		out.Keys = append(out.Keys, ks.row.names...)
	case !isAvro:
		out.Keys = jsonKeyNames(key)
	}
	return out, nil
}

// describeJSON describes a JsonConverter record.
func describeJSON(key, value []byte) (Description, error) {
	out := Description{Format: FormatJSON}
	if !gjson.ValidBytes(value) {
		return out, errors.New("value is neither JSON nor Avro")
	}
	p := gjson.ParseBytes(value)
	if pl := p.Get("payload"); p.Get("schema").Exists() && p.Get("payload").Exists() {
		out.Schemas, p = true, pl
	}
	flat := (p.Get(`__op`).Exists() || p.Get(`__deleted`).Exists()) && !p.Get("source").IsObject()
	switch {
	case p.Get("op").Exists() || flat:
		out.Kind = "data"
	case p.Get("ts_ms").Exists() && len(p.Map()) <= 2:
		out.Kind = "heartbeat"
	case (p.Get("status").Str == "BEGIN" || p.Get("status").Str == "END") && p.Get("id").Exists():
		out.Kind = "transaction"
	case p.Get("ddl").Exists() || p.Get("tableChanges").Exists():
		out.Kind = "schema-change"
	default:
		out.Kind = "other"
	}
	out.Connector = p.Get("source.connector").Str
	row := p
	if !flat {
		if row = p.Get("after"); !row.Exists() || row.Type == gjson.Null {
			row = p.Get("before")
		}
	}
	if row.Type == gjson.String && gjson.Valid(row.Str) { // a MongoDB document
		row = gjson.Parse(row.Str)
	}
	row.ForEach(func(k, _ gjson.Result) bool {
		out.Columns = append(out.Columns, k.Str)
		return true
	})
	if flat {
		out.Columns = flatRowNames(out.Columns)
	}
	out.Keys = jsonKeyNames(key)
	return out, nil
}

// jsonKeyNames are the fields of a JSON message key (with or without the
// JsonConverter's schema); none for a key that is not a JSON object.
func jsonKeyNames(key []byte) []string {
	if !gjson.ValidBytes(key) {
		return nil
	}
	var out []string
	keyPayload(key).ForEach(func(name, _ gjson.Result) bool {
		out = append(out, name.Str)
		return true
	})
	return out
}
