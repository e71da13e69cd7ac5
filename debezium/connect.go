package debezium

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Schema is a Kafka Connect schema as the JsonConverter writes it (and as
// scd2sink reads Debezium's Avro schemas into it): a type, an optional
// semantic name (connect.name) with parameters, fields of structs, the
// element of arrays.
type Schema struct {
	Type       string            `json:"type"`
	Name       string            `json:"name"`
	Field      string            `json:"field"`
	Optional   bool              `json:"optional"`
	Fields     []*Schema         `json:"fields"`
	Items      *Schema           `json:"items"`
	Parameters map[string]string `json:"parameters"`
	// union: in Avro, the value is wrapped in a union with null.
	union bool
}

// field returns the struct field called name, nil if there is none.
func (s *Schema) field(name string) *Schema {
	if s == nil {
		return nil
	}
	for _, f := range s.Fields {
		if f.Field == name {
			return f
		}
	}
	return nil
}

// kind is how a column's values are decoded.
type kind uint8

const (
	kAny kind = iota // no schema: kept as decoded JSON
	kBool
	kInt16
	kInt32
	kInt64
	kFloat32
	kFloat64
	kString
	kBytes
	kDecimal    // Connect Decimal: base64 unscaled integer, scale parameter
	kVarDecimal // Debezium VariableScaleDecimal: {scale, value}
	kDate       // days since the epoch
	kTimeMilli
	kTimeMicro
	kTimeNano
	kTimestampMilli
	kTimestampMicro
	kTimestampNano
	kZonedTimestamp // ISO 8601 in UTC
	kMicroDuration  // microseconds
	kMilliDuration  // milliseconds: MySQL's TIME with time.precision.mode=connect
	kInterval       // ISO 8601 duration
	kJSON           // io.debezium.data.Json: the JSON text
	kStruct         // a struct or map: stored as JSON
	kArray
)

// column is one column of a row schema, ready to decode values.
type column struct {
	name   string
	kind   kind
	pgType string
	scale  int32   // kDecimal
	elem   *column // kArray
	union  bool    // Avro: values come wrapped in a union
}

// The semantic types of DESIGN.md section 4 and their PostgreSQL types.
var semantic = map[string]struct {
	kind   kind
	pgType string
}{
	"org.apache.kafka.connect.data.Decimal":   {kDecimal, "numeric"},
	"io.debezium.data.VariableScaleDecimal":   {kVarDecimal, "numeric"},
	"io.debezium.time.Date":                   {kDate, "date"},
	"org.apache.kafka.connect.data.Date":      {kDate, "date"},
	"io.debezium.time.Time":                   {kTimeMilli, "time"},
	"org.apache.kafka.connect.data.Time":      {kTimeMilli, "time"},
	"io.debezium.time.MicroTime":              {kTimeMicro, "time"},
	"io.debezium.time.NanoTime":               {kTimeNano, "time"},
	"io.debezium.time.Timestamp":              {kTimestampMilli, "timestamp"},
	"org.apache.kafka.connect.data.Timestamp": {kTimestampMilli, "timestamp"},
	"io.debezium.time.MicroTimestamp":         {kTimestampMicro, "timestamp"},
	"io.debezium.time.NanoTimestamp":          {kTimestampNano, "timestamp"},
	"io.debezium.time.ZonedTimestamp":         {kZonedTimestamp, "timestamptz"},
	"io.debezium.time.ZonedTime":              {kString, "timetz"},
	"io.debezium.time.MicroDuration":          {kMicroDuration, "interval"},
	"io.debezium.time.Interval":               {kInterval, "interval"},
	"io.debezium.data.Uuid":                   {kString, "uuid"},
	"io.debezium.data.Json":                   {kJSON, "jsonb"},
	"io.debezium.data.Xml":                    {kString, "xml"},
}

// The Connect base types and their PostgreSQL types.
var base = map[string]struct {
	kind   kind
	pgType string
}{
	"boolean": {kBool, "boolean"},
	"int8":    {kInt16, "smallint"},
	"int16":   {kInt16, "smallint"},
	"int32":   {kInt32, "integer"},
	"int64":   {kInt64, "bigint"},
	"float32": {kFloat32, "real"},
	"float":   {kFloat32, "real"},
	"float64": {kFloat64, "double precision"},
	"double":  {kFloat64, "double precision"},
	"string":  {kString, "text"},
	"bytes":   {kBytes, "bytea"},
	"struct":  {kStruct, "jsonb"},
	"map":     {kStruct, "jsonb"},
}

// durations are the time types that MySQL's and MariaDB's connectors use
// for TIME, which is a duration (-838:59:59 … 838:59:59), not a time of
// day: in their envelopes these map to interval (DESIGN.md section 4).
var durations = map[string]kind{
	"io.debezium.time.MicroTime":         kMicroDuration,
	"io.debezium.time.Time":              kMilliDuration,
	"org.apache.kafka.connect.data.Time": kMilliDuration,
}

// binlogSource says whether an envelope schema's source block is that of
// MySQL's or MariaDB's connector (their TIME columns are durations).
func binlogSource(envelope *Schema) bool {
	src := envelope.field("source")
	if src == nil {
		return false
	}
	switch src.Name {
	case "io.debezium.connector.mysql.Source", "io.debezium.connector.mariadb.Source":
		return true
	}
	return false
}

// newColumn maps one field's schema to a column; with durations, TIME
// types are MySQL's durations.
func newColumn(name string, s *Schema, durs bool) (*column, error) {
	c := &column{name: name, union: s.union}
	if k, ok := durations[s.Name]; ok && durs {
		c.kind, c.pgType = k, "interval"
		return c, nil
	}
	if sem, ok := semantic[s.Name]; ok {
		c.kind, c.pgType = sem.kind, sem.pgType
		if c.kind == kDecimal {
			sc, err := strconv.ParseInt(s.Parameters["scale"], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("column %s: decimal without a valid scale parameter %q", name, s.Parameters["scale"])
			}
			// Plain numeric keeps every value's own scale and survives a
			// widened precision in the source.
			c.scale = int32(sc)
		}
		return c, nil
	}
	if s.Type == "array" {
		if s.Items == nil {
			return nil, fmt.Errorf("column %s: array without items", name)
		}
		el, err := newColumn(name, s.Items, durs)
		if err != nil {
			return nil, err
		}
		if el.kind == kArray || el.kind == kStruct {
			// PostgreSQL arrays are flat; nested structures stay JSON.
			c.kind, c.pgType = kStruct, "jsonb"
			return c, nil
		}
		c.kind, c.elem, c.pgType = kArray, el, el.pgType+"[]"
		return c, nil
	}
	b, ok := base[s.Type]
	if !ok {
		return nil, fmt.Errorf("column %s: unknown Connect type %q", name, s.Type)
	}
	c.kind, c.pgType = b.kind, b.pgType
	return c, nil
}

// rowSchema is the schema of a row image (before/after, or a message key):
// its columns in the schema's order. It implements change.RowDecoder.
type rowSchema struct {
	cols    []*column
	byName  map[string]*column
	names   []string
	columns []change.Column
}

// newRowSchema reads a row schema; durs as for newColumn.
func newRowSchema(s *Schema, durs bool) (*rowSchema, error) {
	if s == nil || s.Type != "struct" {
		return nil, fmt.Errorf("row schema is not a struct")
	}
	r := &rowSchema{byName: map[string]*column{}}
	for _, f := range s.Fields {
		c, err := newColumn(f.Field, f, durs)
		if err != nil {
			return nil, err
		}
		if _, dup := r.byName[c.name]; dup {
			return nil, fmt.Errorf("column %s appears twice", c.name)
		}
		r.cols = append(r.cols, c)
		r.byName[c.name] = c
		r.names = append(r.names, c.name)
		r.columns = append(r.columns, change.Column{Name: c.name, PGType: c.pgType})
	}
	return r, nil
}

// Columns implements change.RowDecoder.
func (r *rowSchema) Columns() []change.Column { return r.columns }

// parseSchema reads a JsonConverter schema.
func parseSchema(raw []byte) (*Schema, error) {
	var s Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	return &s, nil
}
