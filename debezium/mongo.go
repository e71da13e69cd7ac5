package debezium

import (
	"slices"
	"sync"

	"github.com/scd2sink/scd2sink/debezium/mongo"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
)

// MongoDB change events (docs/sources.md): package mongo reads a
// document's images (strings of Extended JSON) and its message key; here
// an envelope is told to be the MongoDB connector's, and the columns of
// its documents are interned as row schemas.

// isMongo says whether an envelope is the MongoDB connector's.
func isMongo(env *jsonEnvelope) bool {
	return env.get([]string{"source", "connector"}).Str == "mongodb"
}

// keyPayload is a JSON message key's object, without the JsonConverter's
// schema when it has one.
func keyPayload(raw []byte) gjson.Result {
	k := gjson.ParseBytes(raw)
	if p := k.Get("payload"); p.IsObject() && k.Get("schema").Exists() {
		return p
	}
	return k
}

// docSchemas interns the row schemas of documents: documents of one
// collection mostly share their fields, and one schema per field set lets
// the sink note a table's columns once per set, not once per event.
type docSchemas struct {
	mu sync.Mutex
	m  map[string]*rowSchema
}

// maxDocSchemas bounds a topic's interned schemas (a collection whose
// documents all differ starts over when it is reached).
const maxDocSchemas = 256

// get returns the interned schema of the columns (names and types, in
// order), making it if new.
func (d *docSchemas) get(cols []change.Column) *rowSchema {
	n := 0
	for _, c := range cols {
		n += len(c.Name) + len(c.PGType) + 2
	}
	sig := make([]byte, 0, n)
	for _, c := range cols {
		sig = append(append(append(append(sig, c.Name...), 0), c.PGType...), 0)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if rs := d.m[string(sig)]; rs != nil {
		return rs
	}
	if d.m == nil || len(d.m) >= maxDocSchemas {
		d.m = map[string]*rowSchema{}
	}
	rs := &rowSchema{byName: make(map[string]*column, len(cols)), columns: slices.Clone(cols)}
	for _, c := range rs.columns {
		col := &column{name: c.Name, kind: kAny, pgType: c.PGType}
		rs.cols = append(rs.cols, col)
		rs.byName[c.Name] = col
		rs.names = append(rs.names, c.Name)
	}
	d.m[string(sig)] = rs
	return rs
}

// mongoDocument reads a document in Extended JSON (mongo.Document) into
// its interned row schema and its typed values.
func (d *docSchemas) mongoDocument(doc string) (*rowSchema, []any, error) {
	cols, vals, err := mongo.Document(doc)
	if err != nil {
		return nil, nil, err
	}
	return d.get(cols), vals, nil
}
