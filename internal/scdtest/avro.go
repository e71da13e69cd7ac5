package scdtest

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/linkedin/goavro/v2"
)

// connectSchema is the part of a JsonConverter field schema that AvroData
// turns into Avro.
type connectSchema struct {
	Type       string            `json:"type"`
	Name       string            `json:"name"`
	Optional   bool              `json:"optional"`
	Parameters map[string]string `json:"parameters"`
	Items      *connectSchema    `json:"items"`
	Fields     []struct {
		Field string `json:"field"`
		Type  string `json:"type"`
	} `json:"fields"`
}

func parseCol(c Col) connectSchema {
	var cs connectSchema
	if err := json.Unmarshal([]byte(c.Schema), &cs); err != nil {
		panic(fmt.Sprintf("column %s: %v", c.Name, err))
	}
	return cs
}

var avroBase = map[string]string{"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float": "float",
	"double": "double", "boolean": "boolean", "string": "string", "bytes": "bytes"}

// avroType renders a Connect schema as Confluent's AvroData does for
// Debezium: connect.name, connect.parameters, connect.type, logical types
// for Connect's own types, optional as a union with null.
func avroType(cs connectSchema, nullFirst bool) any {
	var t any
	switch {
	case cs.Type == "array":
		t = map[string]any{"type": "array", "items": avroType(*cs.Items, true)}
	case cs.Type == "struct":
		var fields []any
		for _, f := range cs.Fields {
			fields = append(fields, map[string]any{"name": f.Field, "type": avroBase[f.Type]})
		}
		t = map[string]any{"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data", "fields": fields,
			"connect.version": 1, "connect.name": cs.Name}
	default:
		m := map[string]any{"type": avroBase[cs.Type]}
		if cs.Type == "int8" || cs.Type == "int16" {
			m["connect.type"] = cs.Type
		}
		if cs.Name != "" {
			m["connect.version"] = 1
			m["connect.name"] = cs.Name
		}
		if len(cs.Parameters) > 0 {
			m["connect.parameters"] = cs.Parameters
		}
		switch cs.Name {
		case "org.apache.kafka.connect.data.Decimal":
			sc, _ := strconv.Atoi(cs.Parameters["scale"])
			m["scale"], m["precision"], m["logicalType"] = sc, 64, "decimal"
		case "org.apache.kafka.connect.data.Date":
			m["logicalType"] = "date"
		case "org.apache.kafka.connect.data.Timestamp":
			m["logicalType"] = "timestamp-millis"
		case "org.apache.kafka.connect.data.Time":
			m["logicalType"] = "time-millis"
		}
		if len(m) == 1 {
			t = m["type"]
		} else {
			t = m
		}
	}
	if !cs.Optional {
		return t
	}
	if nullFirst {
		return []any{"null", t}
	}
	return []any{t, "null"}
}

func (s *Source) avroRecord(name string, cols []Col) map[string]any {
	var fields []any
	for _, c := range cols {
		cs := parseCol(c)
		f := map[string]any{"name": c.Name, "type": avroType(cs, true)}
		if cs.Optional {
			f["default"] = nil
		}
		if cs.Name == "org.apache.kafka.connect.data.Decimal" && cs.Optional {
			// What Debezium really writes for a nullable decimal with a
			// database default: the decimal first, a bytes default that
			// goavro refuses.
			f["type"], f["default"] = avroType(cs, false), "AA=="
		}
		fields = append(fields, f)
	}
	return map[string]any{"type": "record", "name": name, "namespace": s.Server + "." + s.Schema + "." + s.Table,
		"fields": fields, "connect.name": s.Topic() + "." + name}
}

// AvroValueSchema is the envelope's Avro schema as Debezium's AvroConverter
// registers it.
func (s *Source) AvroValueSchema() string {
	ns := s.Server + "." + s.Schema + "." + s.Table
	opt := func(t any) any { return []any{"null", t} }
	source := map[string]any{"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
		"connect.name": "io.debezium.connector.postgresql.Source", "fields": []any{
			map[string]any{"name": "version", "type": "string"}, map[string]any{"name": "connector", "type": "string"},
			map[string]any{"name": "name", "type": "string"}, map[string]any{"name": "ts_ms", "type": "long"},
			map[string]any{"name": "snapshot", "type": opt(map[string]any{"type": "string", "connect.version": 1,
				"connect.parameters": map[string]any{"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},
				"connect.default":    "false", "connect.name": "io.debezium.data.Enum"}), "default": "false"},
			map[string]any{"name": "db", "type": "string"}, map[string]any{"name": "sequence", "type": opt("string"), "default": nil},
			map[string]any{"name": "ts_us", "type": opt("long"), "default": nil}, map[string]any{"name": "ts_ns", "type": opt("long"), "default": nil},
			map[string]any{"name": "schema", "type": "string"}, map[string]any{"name": "table", "type": "string"},
			map[string]any{"name": "txId", "type": opt("long"), "default": nil}, map[string]any{"name": "lsn", "type": opt("long"), "default": nil},
			map[string]any{"name": "xmin", "type": opt("long"), "default": nil},
		}}
	env := map[string]any{"type": "record", "name": "Envelope", "namespace": ns, "connect.name": ns + ".Envelope", "connect.version": 2,
		"fields": []any{
			map[string]any{"name": "before", "type": opt(s.avroRecord("Value", s.Cols)), "default": nil},
			map[string]any{"name": "after", "type": opt(ns + ".Value"), "default": nil},
			map[string]any{"name": "source", "type": source},
			map[string]any{"name": "transaction", "type": opt(map[string]any{"type": "record", "name": "block", "namespace": "event",
				"fields": []any{map[string]any{"name": "id", "type": "string"}, map[string]any{"name": "total_order", "type": "long"},
					map[string]any{"name": "data_collection_order", "type": "long"}}}), "default": nil},
			map[string]any{"name": "op", "type": "string"},
			map[string]any{"name": "ts_ms", "type": opt("long"), "default": nil},
			map[string]any{"name": "ts_us", "type": opt("long"), "default": nil},
			map[string]any{"name": "ts_ns", "type": opt("long"), "default": nil},
		}}
	b, _ := json.Marshal(env)
	return string(b)
}

// AvroKeySchema is the key's Avro schema.
func (s *Source) AvroKeySchema() string {
	var cols []Col
	for _, k := range s.Keys {
		for _, c := range s.Cols {
			if c.Name == k {
				cols = append(cols, c)
			}
		}
	}
	b, _ := json.Marshal(s.avroRecord("Key", cols))
	return string(b)
}

// avroNative turns a row value in Debezium's JSON encoding into goavro's
// native form for the column.
func avroNative(cs connectSchema, v any, union bool) any {
	if v == nil {
		return nil
	}
	var out any
	switch {
	case cs.Type == "array":
		var list []any
		raw, _ := json.Marshal(v)
		var elems []any
		_ = json.Unmarshal(raw, &elems)
		for _, e := range elems {
			list = append(list, avroNative(*cs.Items, e, cs.Items.Optional))
		}
		out = list
	case cs.Type == "struct":
		m := v.(map[string]any)
		b, _ := base64.StdEncoding.DecodeString(m["value"].(string))
		out = map[string]any{"scale": int32(toInt(m["scale"])), "value": b}
		if union {
			return goavro.Union("io.debezium.data.VariableScaleDecimal", out)
		}
		return out
	case cs.Type == "bytes":
		b, err := base64.StdEncoding.DecodeString(v.(string))
		if err != nil {
			panic(err)
		}
		out = b
	case cs.Type == "int8" || cs.Type == "int16" || cs.Type == "int32":
		out = int32(toInt(v))
	case cs.Type == "int64":
		out = toInt(v)
	case cs.Type == "float":
		out = float32(v.(float64))
	default:
		out = v
	}
	if !union {
		return out
	}
	branch := avroBase[cs.Type]
	if cs.Type == "array" {
		branch = "array"
	}
	return goavro.Union(branch, out)
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int64:
		return x
	case float64:
		return int64(x)
	}
	panic(fmt.Sprintf("toInt(%T)", v))
}

// AvroEnvelope renders one change in the Confluent wire format with the
// given schema ids (keyID 0: the key as JSON with its schema).
func (s *Source) AvroEnvelope(c Change, valueID, keyID int) (key, value []byte) {
	rowNative := func(r Row, union bool) any {
		if r == nil {
			return nil
		}
		m := map[string]any{}
		for _, col := range s.Cols {
			cs := parseCol(col)
			m[col.Name] = avroNative(cs, r[col.Name], cs.Optional)
		}
		if union {
			return goavro.Union(s.Server+"."+s.Schema+"."+s.Table+".Value", m)
		}
		return m
	}
	commit := c.Commit.UTC()
	snap := c.Snapshot
	if snap == "" {
		snap = "false"
	}
	seq := fmt.Sprintf("[null,%q]", strconv.FormatInt(c.LSN, 10))
	if c.PrevLSN != 0 {
		seq = fmt.Sprintf("[%q,%q]", strconv.FormatInt(c.PrevLSN, 10), strconv.FormatInt(c.LSN, 10))
	}
	native := map[string]any{
		"before": rowNative(c.Before, true), "after": rowNative(c.After, true),
		"source": map[string]any{"version": "3.6.1.Final", "connector": "postgresql", "name": s.Server, "ts_ms": commit.UnixMilli(),
			"snapshot": goavro.Union("string", snap), "db": s.DB, "sequence": goavro.Union("string", seq),
			"ts_us": goavro.Union("long", commit.UnixMicro()), "ts_ns": goavro.Union("long", commit.UnixNano()),
			"schema": s.Schema, "table": s.Table, "txId": goavro.Union("long", c.TxID), "lsn": goavro.Union("long", c.LSN), "xmin": nil},
		"transaction": avroTxn(c.Txn), "op": c.Op,
		"ts_ms": goavro.Union("long", commit.Add(37*time.Millisecond).UnixMilli()),
		"ts_us": goavro.Union("long", commit.Add(37*time.Millisecond).UnixMicro()),
		"ts_ns": goavro.Union("long", commit.Add(37*time.Millisecond).UnixNano()),
	}
	value = encodeAvro(stripDefaults(s.AvroValueSchema()), valueID, native)
	if keyID == 0 {
		key, _ = s.Envelope(c)
		return key, value
	}
	img := c.After
	if img == nil {
		img = c.Before
	}
	km := map[string]any{}
	for _, k := range s.Keys {
		for _, col := range s.Cols {
			if col.Name == k {
				cs := parseCol(col)
				km[k] = avroNative(cs, img[k], cs.Optional)
			}
		}
	}
	return encodeAvro(stripDefaults(s.AvroKeySchema()), keyID, km), value
}

// stripDefaults removes defaults so that goavro accepts the schema for
// encoding test records (the decoder under test gets the real schema).
func stripDefaults(schema string) string {
	if s, ok := stripped.Load(schema); ok {
		return s.(string)
	}
	out := stripDefaultsOnce(schema)
	stripped.Store(schema, out)
	return out
}

// stripped and codecs cache what encoding a schema's records needs
// (benchmarks encode hundreds of thousands).
var stripped, codecs sync.Map

func stripDefaultsOnce(schema string) string {
	var v any
	_ = json.Unmarshal([]byte(schema), &v)
	var walk func(any) any
	walk = func(x any) any {
		switch t := x.(type) {
		case map[string]any:
			delete(t, "default")
			if t["logicalType"] == "decimal" || t["logicalType"] == "date" || t["logicalType"] == "timestamp-millis" || t["logicalType"] == "time-millis" {
				delete(t, "logicalType") // encode the raw bytes and ints
			}
			for k, e := range t {
				t[k] = walk(e)
			}
		case []any:
			for i, e := range t {
				t[i] = walk(e)
			}
		}
		return x
	}
	b, _ := json.Marshal(walk(v))
	return string(b)
}

func encodeAvro(schema string, id int, native any) []byte {
	var codec *goavro.Codec
	if c, ok := codecs.Load(schema); ok {
		codec = c.(*goavro.Codec)
	} else {
		var err error
		if codec, err = goavro.NewCodec(schema); err != nil {
			panic(err)
		}
		codecs.Store(schema, codec)
	}
	out := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(id))
	out, err := codec.BinaryFromNative(out, native)
	if err != nil {
		panic(err)
	}
	return out
}

// ApicurioHeaders turns a record in the Confluent wire format (as
// AvroEnvelope writes it) into Apicurio's default framing: the bare Avro
// body, and the 8-byte id its apicurio.*.globalId (or contentId) header
// holds.
func ApicurioHeaders(b []byte) (body, id []byte) {
	id = binary.BigEndian.AppendUint64(nil, uint64(binary.BigEndian.Uint32(b[1:5])))
	return b[5:], id
}

// ApicurioWire8 turns a record in the Confluent wire format into the
// wire format of Apicurio's 2.x DefaultIdHandler: magic byte 0 and an
// 8-byte id.
func ApicurioWire8(b []byte) []byte {
	out := binary.BigEndian.AppendUint64([]byte{0}, uint64(binary.BigEndian.Uint32(b[1:5])))
	return append(out, b[5:]...)
}

// avroTxn is a transaction block as goavro encodes it (nil: null).
func avroTxn(b *TxnBlock) any {
	if b == nil {
		return nil
	}
	return goavro.Union("event.block", map[string]any{"id": b.ID, "total_order": b.TotalOrder, "data_collection_order": b.DataCollectionOrder})
}

// AvroTransactionSchema is the Avro schema of a transaction metadata
// record, as Debezium's AvroConverter writes it.
const AvroTransactionSchema = `{"type":"record","name":"TransactionMetadataValue","namespace":"io.debezium.connector.common","fields":[
{"name":"status","type":"string"},{"name":"id","type":"string"},{"name":"event_count","type":["null","long"],"default":null},
{"name":"data_collections","type":["null",{"type":"array","items":{"type":"record","name":"ConnectDefault","namespace":"io.confluent.connect.avro",
"fields":[{"name":"data_collection","type":"string"},{"name":"event_count","type":"long"}]}}],"default":null},
{"name":"ts_ms","type":"long"}]}`

// AvroTransactionRecord renders a BEGIN (counts nil) or END record as the
// AvroConverter writes it, framed with the Confluent schema id valueID.
func AvroTransactionRecord(id string, commit time.Time, counts map[string]int64, valueID int) []byte {
	native := map[string]any{"status": "BEGIN", "id": id, "event_count": nil, "data_collections": nil, "ts_ms": commit.UnixMilli()}
	if counts != nil {
		var total int64
		var list []any
		for n, c := range counts {
			total += c
			list = append(list, map[string]any{"data_collection": n, "event_count": c})
		}
		native["status"], native["event_count"] = "END", goavro.Union("long", total)
		native["data_collections"] = goavro.Union("array", list)
	}
	return encodeAvro(AvroTransactionSchema, valueID, native)
}
