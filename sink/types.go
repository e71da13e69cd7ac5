package sink

import (
	"bytes"
	"encoding/json"
	"fmt"

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

// registerTypes installs rawJSONTypes and fastTypes on a connection's type
// map, once.
func registerTypes(m *pgtype.Map) {
	if t, ok := m.TypeForOID(pgtype.JSONBOID); ok && t == rawJSONTypes[1] {
		return
	}
	m.RegisterTypes(rawJSONTypes)
	m.RegisterTypes(fastTypesOnce)
}

// normalizeRow turns what pgx returns for infinite timestamps and dates
// (a bare InfinityModifier) into values pgx can write back.
func (t *table) normalizeRow(row []any) {
	if !t.hasInfinity {
		return
	}
	for i, v := range row {
		im, ok := v.(pgtype.InfinityModifier)
		if !ok {
			continue
		}
		switch t.cols[i].oid {
		case pgtype.TimestamptzOID:
			row[i] = pgtype.Timestamptz{InfinityModifier: im, Valid: true}
		case pgtype.TimestampOID:
			row[i] = pgtype.Timestamp{InfinityModifier: im, Valid: true}
		case pgtype.DateOID:
			row[i] = pgtype.Date{InfinityModifier: im, Valid: true}
		}
	}
}

// infinityCanon renders an infinite time value for canon; ok is false for
// finite values.
func infinityCanon(v any) (string, bool) {
	var im pgtype.InfinityModifier
	switch x := v.(type) {
	case pgtype.InfinityModifier:
		im = x
	case pgtype.Timestamptz:
		im = x.InfinityModifier
	case pgtype.Timestamp:
		im = x.InfinityModifier
	case pgtype.Date:
		im = x.InfinityModifier
	default:
		return "", false
	}
	if im == pgtype.Finite {
		return "", false
	}
	return fmt.Sprintf("Tinf%d", im), true
}
