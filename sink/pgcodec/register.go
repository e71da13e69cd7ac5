package pgcodec

import (
	"bytes"
	"encoding/json"

	"github.com/jackc/pgx/v5/pgtype"
)

// The types scd2sink installs on every connection it writes through.
//
// JSON columns are read as their text (json.RawMessage), never decoded into
// Go values: a JSON null, a 20-digit number or 1.10 must come back exactly
// as stored, to be compared and written again unchanged.
var rawJSONTypes = func() []*pgtype.Type {
	unmarshal := func(data []byte, v any) error {
		if p, ok := v.(*any); ok {
			*p = json.RawMessage(bytes.Clone(data))
			return nil
		}
		return json.Unmarshal(data, v)
	}
	js := &pgtype.Type{Name: "json", OID: pgtype.JSONOID, Codec: &pgtype.JSONCodec{Marshal: json.Marshal, Unmarshal: unmarshal}}
	jsb := &pgtype.Type{Name: "jsonb", OID: pgtype.JSONBOID, Codec: &pgtype.JSONBCodec{Marshal: json.Marshal, Unmarshal: unmarshal}}
	ttz := &pgtype.Type{Name: "timetz", OID: pgtype.TimetzOID, Codec: timetzCodec{}}
	return []*pgtype.Type{js, jsb, ttz,
		{Name: "_json", OID: pgtype.JSONArrayOID, Codec: &pgtype.ArrayCodec{ElementType: js}},
		{Name: "_jsonb", OID: pgtype.JSONBArrayOID, Codec: &pgtype.ArrayCodec{ElementType: jsb}},
		{Name: "_timetz", OID: timetzArrayOID, Codec: &pgtype.ArrayCodec{ElementType: ttz}},
	}
}()

// timetzArrayOID is _timetz's OID (pgx names no constant for it).
const timetzArrayOID = 1270

// fastTypesOnce are fastTypes, shared by every connection.
var fastTypesOnce = fastTypes()

// Register installs rawJSONTypes and fastTypes on a connection's type
// map, and the encode plan of a RawArray, once.
func Register(m *pgtype.Map) {
	if t, ok := m.TypeForOID(pgtype.JSONBOID); ok && t == rawJSONTypes[1] {
		return
	}
	m.RegisterTypes(rawJSONTypes)
	m.RegisterTypes(fastTypesOnce)
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryRawArray}, m.TryWrapEncodePlanFuncs...)
}
