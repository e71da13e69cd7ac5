package debezium

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/linkedin/goavro/v2"
)

// Reading an Avro envelope without maps.
//
// goavro decodes a whole record into maps: the envelope, its before and
// after images, its source block, and one map per union value (every
// optional column). The sink reads none of before, and the after image
// only as the row's typed values. So an envelope is read field by field
// in its writer schema's order, as Avro's binary encoding lays them out
// (a record is its fields one after the other, a union its branch index
// then the branch's value): before is skipped, the after image's columns
// are decoded straight into the row's values, and everything else goes
// into a record map shaped as goavro shapes it, with optional primitive
// values unwrapped (avroPath's unwrapping leaves a non-map as it is).
// Each value itself is decoded by goavro, with a codec built once per
// writer schema for its type; only the layout (record fields, union
// indexes, and skipping what is not read: varints, lengths, fixed sizes,
// array and map blocks) is walked here. An envelope the plan does not
// cover (a union of more than null and one type, no after field) is
// decoded by goavro whole, as before (TestAvroPlanMatchesGoavro compares
// the two over every column type).

// avroKind is an Avro type's kind, as the binary encoding lays it out.
type avroKind uint8

const (
	aNull avroKind = iota
	aBoolean
	aInt // int, long and enum: a zigzag varint
	aFloat
	aDouble
	aBytes // bytes and string: a length, then the bytes
	aFixed
	aRecord
	aArray
	aMap
	aUnion
)

// avroNode is how one writer type is read: its layout, and the goavro
// codec that decodes a value of it.
type avroNode struct {
	kind     avroKind
	size     int // aFixed
	fields   []avroField
	branches []*avroNode // aUnion
	items    *avroNode   // aArray, aMap
	codec    *goavro.Codec
	json     any // standalone definition, for the codec
}

type avroField struct {
	name string
	node *avroNode
}

// avroPlan reads an envelope of one writer schema.
type avroPlan struct {
	fields []avroField
	before int // the field skipped (-1: none)
	after  int // the field read into the row's values
	// afterNull is the after union's null branch; afterRec its record
	// (whose fields are the row's columns, in the row's order).
	afterNull int
	afterRec  *avroNode
}

var errAvroShort = errors.New("avro record is cut short")

// newAvroPlan builds the plan of an envelope's stripped writer schema,
// or returns nil when the plan does not cover it (goavro decodes it
// whole). cols are the row's columns (the after image's fields).
func newAvroPlan(stripped string, cols int) *avroPlan {
	var root any
	if json.Unmarshal([]byte(stripped), &root) != nil {
		return nil
	}
	b := &avroBuilder{named: map[string]*avroNode{}, defs: map[string]any{}}
	top, err := b.node(root, "")
	if err != nil || top.kind != aRecord {
		return nil
	}
	p := &avroPlan{fields: top.fields, before: -1, after: -1}
	for i, f := range top.fields {
		switch f.name {
		case "before":
			p.before = i
		case "after":
			p.after = i
		}
	}
	if p.after < 0 {
		return nil
	}
	u := top.fields[p.after].node
	if u.kind != aUnion || len(u.branches) != 2 {
		return nil
	}
	p.afterNull = -1
	for i, br := range u.branches {
		if br.kind == aNull {
			p.afterNull = i
		} else {
			p.afterRec = br
		}
	}
	if p.afterNull < 0 || p.afterRec == nil || p.afterRec.kind != aRecord || len(p.afterRec.fields) != cols {
		return nil
	}
	for i, f := range top.fields {
		if i == p.before || i == p.after {
			continue
		}
		if err := b.codecs(f.node, f.name == "source"); err != nil {
			return nil
		}
	}
	for _, f := range p.afterRec.fields {
		if err := b.codecs(f.node, false); err != nil {
			return nil
		}
	}
	return p
}

// decode reads an envelope: the record map of its fields but before and
// after, and the after image's values through row (nil after: a null
// image, or none in the record).
func (p *avroPlan) decode(body []byte, row *rowSchema) (rec map[string]any, after []any, err error) {
	rec = make(map[string]any, len(p.fields))
	b := body
	for i, f := range p.fields {
		switch i {
		case p.before:
			if b, err = f.node.skip(b); err != nil {
				return nil, nil, fmt.Errorf("before: %w", err)
			}
		case p.after:
			var idx int64
			if idx, b, err = avroLong(b); err != nil {
				return nil, nil, fmt.Errorf("after: %w", err)
			}
			if idx < 0 || idx > 1 {
				return nil, nil, fmt.Errorf("after: union branch %d of 2", idx)
			}
			if int(idx) == p.afterNull {
				continue
			}
			rec["after"] = struct{}{} // present (avroPath sees a non-nil value)
			after = make([]any, len(row.cols))
			for j, cf := range p.afterRec.fields {
				var v any
				if v, b, err = cf.node.value(b, false); err != nil {
					return nil, nil, fmt.Errorf("column %s: %w", cf.name, err)
				}
				if after[j], err = row.cols[j].nativeValue(v); err != nil {
					return nil, nil, fmt.Errorf("column %s: %w", cf.name, err)
				}
			}
		default:
			var v any
			if f.name == "source" && f.node.kind == aRecord {
				v, b, err = f.node.recordMap(b)
			} else {
				v, b, err = f.node.value(b, true)
			}
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", f.name, err)
			}
			rec[f.name] = v
		}
	}
	if len(b) != 0 {
		return nil, nil, fmt.Errorf("%d bytes left over", len(b))
	}
	return rec, after, nil
}

// value decodes one value: an optional one's branch read here, its value
// unwrapped when primitive or when wrap is false (a row's column: the
// column mapping takes the branch's value), else wrapped for avroPath to
// unwrap; any other by goavro.
func (n *avroNode) value(b []byte, wrap bool) (any, []byte, error) {
	if n.kind != aUnion {
		return n.codec.NativeFromBinary(b)
	}
	idx, b, err := avroLong(b)
	if err != nil {
		return nil, nil, err
	}
	if idx < 0 || int(idx) >= len(n.branches) {
		return nil, nil, fmt.Errorf("union branch %d of %d", idx, len(n.branches))
	}
	br := n.branches[idx]
	if br.kind == aNull {
		return nil, b, nil
	}
	v, b, err := br.codec.NativeFromBinary(b)
	if err != nil || !wrap || br.kind < aFixed {
		return v, b, err
	}
	return map[string]any{"": v}, b, nil // avroPath unwraps a complex branch's value
}

// recordMap decodes a record into a map of its fields' values (value).
func (n *avroNode) recordMap(b []byte) (any, []byte, error) {
	m := make(map[string]any, len(n.fields))
	for _, f := range n.fields {
		v, rest, err := f.node.value(b, true)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", f.name, err)
		}
		m[f.name], b = v, rest
	}
	return m, b, nil
}

// skip passes over one value.
func (n *avroNode) skip(b []byte) ([]byte, error) {
	switch n.kind {
	case aNull:
		return b, nil
	case aBoolean:
		return avroAdvance(b, 1)
	case aInt:
		_, b, err := avroLong(b)
		return b, err
	case aFloat:
		return avroAdvance(b, 4)
	case aDouble:
		return avroAdvance(b, 8)
	case aBytes:
		l, b, err := avroLong(b)
		if err != nil {
			return nil, err
		}
		return avroAdvance(b, l)
	case aFixed:
		return avroAdvance(b, int64(n.size))
	case aRecord:
		var err error
		for _, f := range n.fields {
			if b, err = f.node.skip(b); err != nil {
				return nil, fmt.Errorf("%s: %w", f.name, err)
			}
		}
		return b, nil
	case aUnion:
		idx, b, err := avroLong(b)
		if err != nil {
			return nil, err
		}
		if idx < 0 || int(idx) >= len(n.branches) {
			return nil, fmt.Errorf("union branch %d of %d", idx, len(n.branches))
		}
		return n.branches[idx].skip(b)
	}
	// Arrays and maps: blocks of items, each block's count first (a
	// negative count is followed by the block's size in bytes), until a
	// count of 0.
	for {
		count, rest, err := avroLong(b)
		if err != nil {
			return nil, err
		}
		b = rest
		if count == 0 {
			return b, nil
		}
		if count > int64(goavro.MaxBlockCount) || count < -int64(goavro.MaxBlockCount) {
			return nil, fmt.Errorf("a block of %d items: more than %d", count, goavro.MaxBlockCount)
		}
		if count < 0 {
			size, rest, err := avroLong(b)
			if err != nil {
				return nil, err
			}
			if b, err = avroAdvance(rest, size); err != nil {
				return nil, err
			}
			continue
		}
		if n.kind == aArray && n.items.zeroWidth(0) {
			continue // items of no bytes: nothing to pass over, however many
		}
		for ; count > 0; count-- {
			if n.kind == aMap {
				if b, err = (&avroNode{kind: aBytes}).skip(b); err != nil {
					return nil, err
				}
			}
			if b, err = n.items.skip(b); err != nil {
				return nil, err
			}
		}
	}
}

// zeroWidth reports whether a value of n takes no bytes (null, an empty
// record, a fixed of size 0); depth bounds a named type that refers to
// itself.
func (n *avroNode) zeroWidth(depth int) bool {
	switch {
	case depth > 32:
		return false
	case n.kind == aNull:
		return true
	case n.kind == aFixed:
		return n.size == 0
	case n.kind == aRecord:
		for _, f := range n.fields {
			if !f.node.zeroWidth(depth + 1) {
				return false
			}
		}
		return true
	}
	return false
}

// avroLong reads a zigzag varint (Avro's int, long, lengths and counts).
func avroLong(b []byte) (int64, []byte, error) {
	v, n := binary.Varint(b)
	switch {
	case n == 0:
		return 0, nil, errAvroShort
	case n < 0:
		return 0, nil, errors.New("a varint longer than 64 bits")
	}
	return v, b[n:], nil
}

// avroAdvance passes over n bytes (a length or size read before).
func avroAdvance(b []byte, n int64) ([]byte, error) {
	switch {
	case n < 0:
		return nil, fmt.Errorf("a negative length (%d)", n)
	case n > int64(len(b)) || n > math.MaxInt32:
		return nil, fmt.Errorf("%w: %d bytes wanted, %d left", errAvroShort, n, len(b))
	}
	return b[n:], nil
}

// avroBuilder builds the nodes of a writer schema, named types once.
type avroBuilder struct {
	named map[string]*avroNode
	defs  map[string]any // full name → definition, names made full
}

var avroKinds = map[string]avroKind{"null": aNull, "boolean": aBoolean, "int": aInt, "long": aInt, "float": aFloat,
	"double": aDouble, "bytes": aBytes, "string": aBytes}

// node builds the node of the schema v (in namespace ns); its json is a
// standalone definition, every named type it uses inlined.
func (b *avroBuilder) node(v any, ns string) (*avroNode, error) {
	switch x := v.(type) {
	case string:
		if k, ok := avroKinds[x]; ok {
			return &avroNode{kind: k, json: x}, nil
		}
		for _, name := range []string{fullName(x, ns), x} {
			if n, ok := b.named[name]; ok {
				return n, nil
			}
		}
		return nil, fmt.Errorf("unknown type %q", x)
	case []any:
		n := &avroNode{kind: aUnion}
		js := make([]any, len(x))
		for i, e := range x {
			br, err := b.node(e, ns)
			if err != nil {
				return nil, err
			}
			n.branches, js[i] = append(n.branches, br), br.json
		}
		n.json = js
		return n, nil
	case map[string]any:
		return b.complex(x, ns)
	}
	return nil, fmt.Errorf("a %T where a type belongs", v)
}

func (b *avroBuilder) complex(x map[string]any, ns string) (*avroNode, error) {
	typ, _ := x["type"].(string)
	js := make(map[string]any, len(x))
	for k, e := range x {
		if k != "fields" && k != "items" && k != "values" && k != "namespace" {
			js[k] = e
		}
	}
	n := &avroNode{json: js}
	named := func() {
		name, _ := x["name"].(string)
		if nsx, ok := x["namespace"].(string); ok {
			ns = nsx
		}
		full := fullName(name, ns)
		js["name"] = full
		b.named[full] = n
	}
	switch typ {
	case "record":
		n.kind = aRecord
		named()
		fields, _ := x["fields"].([]any)
		var fjs []any
		for _, f := range fields {
			fm, ok := f.(map[string]any)
			if !ok {
				return nil, errors.New("a malformed field")
			}
			name, _ := fm["name"].(string)
			fn, err := b.node(fm["type"], ns)
			if err != nil {
				return nil, err
			}
			n.fields = append(n.fields, avroField{name: name, node: fn})
			fj := make(map[string]any, len(fm))
			for k, e := range fm {
				fj[k] = e
			}
			fj["type"] = fn.json
			fjs = append(fjs, fj)
		}
		js["fields"] = fjs
	case "enum":
		n.kind = aInt
		named()
	case "fixed":
		n.kind = aFixed
		named()
		size, _ := x["size"].(float64)
		n.size = int(size)
	case "array", "map":
		n.kind = aArray
		key := "items"
		if typ == "map" {
			n.kind, key = aMap, "values"
		}
		it, err := b.node(x[key], ns)
		if err != nil {
			return nil, err
		}
		n.items, js[key] = it, it.json
	default:
		k, ok := avroKinds[typ]
		if !ok {
			if typ == "" {
				return b.node(x["type"], ns)
			}
			return nil, fmt.Errorf("avro type %q", typ)
		}
		n.kind = k
	}
	return n, nil
}

// codecs builds the goavro codecs that value (and, for the source
// record, recordMap) decodes n with.
func (b *avroBuilder) codecs(n *avroNode, asRecord bool) error {
	switch {
	case asRecord && n.kind == aRecord:
		for _, f := range n.fields {
			if err := b.codecs(f.node, false); err != nil {
				return err
			}
		}
		return nil
	case n.kind == aUnion:
		for _, br := range n.branches {
			if br.kind != aNull {
				if err := b.codecs(br, false); err != nil {
					return err
				}
			}
		}
		return nil
	case n.codec != nil:
		return nil
	}
	text, err := json.Marshal(standalone(n.json, map[string]bool{}))
	if err != nil {
		return err
	}
	n.codec, err = goavro.NewCodec(string(text))
	return err
}

// standalone is a definition in which each named type is defined where
// it first appears and named after that, as one schema must be.
func standalone(v any, seen map[string]bool) any {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = standalone(e, seen)
		}
		return out
	case map[string]any:
		if name, ok := x["name"].(string); ok {
			if t, _ := x["type"].(string); t == "record" || t == "enum" || t == "fixed" {
				if seen[name] {
					return name
				}
				seen[name] = true
			}
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			switch k {
			case "fields":
				fs, _ := e.([]any)
				nf := make([]any, len(fs))
				for i, f := range fs {
					fm, _ := f.(map[string]any)
					c := make(map[string]any, len(fm))
					for fk, fe := range fm {
						c[fk] = fe
					}
					c["type"] = standalone(fm["type"], seen)
					nf[i] = c
				}
				out[k] = nf
			case "items", "values", "type":
				out[k] = standalone(e, seen)
			default:
				out[k] = e
			}
		}
		return out
	}
	return v
}
