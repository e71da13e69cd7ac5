package scdtest

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Flatten rewrites a Debezium envelope (JsonConverter with schemas) as
// Debezium's ExtractNewRecordState writes it with add.fields (e.g. "op",
// "source.lsn", "source.ts_ms") and delete.tombstone.handling.mode=rewrite:
// the row (after, or before for a delete) with the added fields, named
// "__op", "__source_lsn", …, and "__deleted" ("true" or "false", a
// string, as the relational transform writes it), its schema the row's
// with theirs. A tombstone (nil) stays one.
func Flatten(value []byte, fields ...string) []byte {
	if value == nil {
		return nil
	}
	var env struct {
		Schema  map[string]any `json:"schema"`
		Payload map[string]any `json:"payload"`
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	if err := dec.Decode(&env); err != nil {
		panic(err)
	}
	schemaOf := func(s map[string]any, name string) map[string]any {
		for _, f := range s["fields"].([]any) {
			if f := f.(map[string]any); f["field"] == name {
				return f
			}
		}
		return nil
	}
	img := "after"
	if env.Payload["op"] == "d" {
		img = "before"
	}
	rowSchema := schemaOf(env.Schema, "after")
	out := map[string]any{}
	for k, v := range env.Payload[img].(map[string]any) {
		out[k] = v
	}
	sfields := append([]any(nil), rowSchema["fields"].([]any)...)
	for _, f := range fields {
		parts := strings.Split(f, ".")
		name := "__" + strings.Join(parts, "_")
		s, v := env.Schema, any(env.Payload)
		for _, p := range parts {
			s = schemaOf(s, p)
			v = v.(map[string]any)[p]
		}
		fs := map[string]any{}
		for k, x := range s {
			fs[k] = x
		}
		fs["field"] = name
		sfields = append(sfields, fs)
		out[name] = v
	}
	sfields = append(sfields, map[string]any{"type": "string", "optional": true, "field": "__deleted"})
	out["__deleted"] = "false"
	if img == "before" {
		out["__deleted"] = "true"
	}
	// The payload in the schema's order, as the JsonConverter writes a
	// Struct (the row's fields, then the transform's).
	var payload bytes.Buffer
	payload.WriteByte('{')
	for i, f := range sfields {
		name := f.(map[string]any)["field"].(string)
		if i > 0 {
			payload.WriteByte(',')
		}
		k, _ := json.Marshal(name)
		v, err := json.Marshal(out[name])
		if err != nil {
			panic(err)
		}
		payload.Write(k)
		payload.WriteByte(':')
		payload.Write(v)
	}
	payload.WriteByte('}')
	b, err := json.Marshal(map[string]any{
		"schema":  map[string]any{"type": "struct", "fields": sfields, "optional": false, "name": rowSchema["name"]},
		"payload": json.RawMessage(payload.Bytes()),
	})
	if err != nil {
		panic(err)
	}
	return b
}
