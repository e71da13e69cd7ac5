package debezium

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// fromAvro reads a writer schema as Debezium's AvroConverter writes it
// (records with connect.name, connect.parameters, connect.type, logical
// types, optional fields as unions with null) into the Connect schema model
// the column mapping uses. It also returns the schema to hand to goavro:
// without defaults (they play no part when reading with the writer's own
// schema, and goavro refuses some that Debezium writes, such as "AA==" for
// a nullable decimal) and without logical types (so goavro returns the
// raw ints and bytes, which the column mapping decodes exactly).
func fromAvro(text string) (*Schema, string, error) {
	var root any
	if err := json.Unmarshal([]byte(text), &root); err != nil {
		return nil, "", fmt.Errorf("avro schema is not JSON: %w", err)
	}
	c := &avroConv{named: map[string]*Schema{}}
	s, err := c.convert(root, "")
	if err != nil {
		return nil, "", err
	}
	stripped, err := json.Marshal(strip(root))
	if err != nil {
		return nil, "", err
	}
	return s, string(stripped), nil
}

// strip removes defaults and logical types, recursively.
func strip(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			if k == "default" || k == "logicalType" {
				continue
			}
			out[k] = strip(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = strip(e)
		}
		return out
	}
	return v
}

type avroConv struct {
	named map[string]*Schema // full name → schema, for references
}

var avroPrimitive = map[string]string{
	"boolean": "boolean", "int": "int32", "long": "int64", "float": "float32", "double": "float64",
	"string": "string", "bytes": "bytes",
}

// logical maps Avro logical types to the Connect names they stand for.
var logical = map[string]string{
	"decimal":          "org.apache.kafka.connect.data.Decimal",
	"date":             "org.apache.kafka.connect.data.Date",
	"time-millis":      "org.apache.kafka.connect.data.Time",
	"timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
	"time-micros":      "io.debezium.time.MicroTime",
	"timestamp-micros": "io.debezium.time.MicroTimestamp",
	"uuid":             "io.debezium.data.Uuid",
}

func fullName(name, ns string) string {
	if strings.Contains(name, ".") || ns == "" {
		return name
	}
	return ns + "." + name
}

func (c *avroConv) convert(v any, ns string) (*Schema, error) {
	switch x := v.(type) {
	case string:
		if x == "null" {
			return &Schema{Type: "null"}, nil
		}
		if t, ok := avroPrimitive[x]; ok {
			return &Schema{Type: t}, nil
		}
		if s, ok := c.named[fullName(x, ns)]; ok {
			return s, nil
		}
		if s, ok := c.named[x]; ok {
			return s, nil
		}
		return nil, fmt.Errorf("avro schema names unknown type %q", x)
	case []any:
		var branches []*Schema
		null := false
		for _, b := range x {
			s, err := c.convert(b, ns)
			if err != nil {
				return nil, err
			}
			if s.Type == "null" {
				null = true
				continue
			}
			branches = append(branches, s)
		}
		if len(branches) != 1 {
			return nil, fmt.Errorf("avro union of %d types other than null: only optional fields are supported", len(branches))
		}
		out := *branches[0]
		out.Optional, out.union = null, true
		return &out, nil
	case map[string]any:
		return c.complex(x, ns)
	}
	return nil, fmt.Errorf("avro schema has a %T where a type belongs", v)
}

func (c *avroConv) complex(x map[string]any, ns string) (*Schema, error) {
	typ, _ := x["type"].(string)
	s := &Schema{}
	if name, ok := x["connect.name"].(string); ok {
		s.Name = name
	}
	if params, ok := x["connect.parameters"].(map[string]any); ok {
		s.Parameters = map[string]string{}
		for k, v := range params {
			s.Parameters[k] = fmt.Sprint(v)
		}
	}
	if lt, ok := x["logicalType"].(string); ok && s.Name == "" {
		s.Name = logical[lt]
		if lt == "decimal" {
			if s.Parameters == nil {
				s.Parameters = map[string]string{}
			}
			if _, ok := s.Parameters["scale"]; !ok {
				sc, _ := x["scale"].(float64)
				s.Parameters["scale"] = strconv.Itoa(int(sc))
			}
		}
	}
	switch typ {
	case "record":
		name, _ := x["name"].(string)
		if n, ok := x["namespace"].(string); ok {
			ns = n
		}
		s.Type = "struct"
		if name != "" {
			c.named[fullName(name, ns)] = s
			if s.Name == "" {
				s.Name = fullName(name, ns)
			}
		}
		fields, _ := x["fields"].([]any)
		for _, f := range fields {
			fm, ok := f.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("avro record %s has a malformed field", name)
			}
			fs, err := c.convert(fm["type"], ns)
			if err != nil {
				return nil, err
			}
			fc := *fs
			fc.Field, _ = fm["name"].(string)
			s.Fields = append(s.Fields, &fc)
		}
		return s, nil
	case "array":
		items, err := c.convert(x["items"], ns)
		if err != nil {
			return nil, err
		}
		s.Type, s.Items = "array", items
		return s, nil
	case "map":
		s.Type = "map"
		return s, nil
	case "enum":
		s.Type = "string"
		if name, ok := x["name"].(string); ok {
			c.named[fullName(name, ns)] = s
		}
		return s, nil
	case "fixed":
		s.Type = "bytes"
		if name, ok := x["name"].(string); ok {
			c.named[fullName(name, ns)] = s
		}
		return s, nil
	}
	if t, ok := avroPrimitive[typ]; ok {
		s.Type = t
		if ct, ok := x["connect.type"].(string); ok && (ct == "int8" || ct == "int16") {
			s.Type = ct
		}
		return s, nil
	}
	if typ == "" {
		return c.convert(x["type"], ns)
	}
	return nil, fmt.Errorf("avro type %q is not supported", typ)
}
