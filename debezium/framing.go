package debezium

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/sr"
)

// GlobalRegistry is a Registry that also serves Apicurio's global ids
// (schema_registry.kind apicurio); its SchemaByID then takes content ids.
// It is called only on a cache miss, from several goroutines at once.
type GlobalRegistry interface {
	Registry
	SchemaByGlobalID(ctx context.Context, id int64) (sr.Schema, error)
}

// WireIDs says what the id after the magic byte 0 of the wire format is.
type WireIDs int

const (
	// ConfluentIDs is a Confluent schema id of 4 bytes (kind confluent;
	// Apicurio's content ids through its ccompat API are the same).
	ConfluentIDs WireIDs = iota
	// ApicurioGlobalIDs is an Apicurio global id, of 8 bytes (the 2.x
	// converter's DefaultIdHandler) or 4 (Legacy4ByteIdHandler,
	// as-confluent): apicurio.registry.use-id=globalId.
	ApicurioGlobalIDs
	// ApicurioContentIDs is an Apicurio content id, of 8 or 4 bytes:
	// apicurio.registry.use-id=contentId (the 3.x converter's default).
	ApicurioContentIDs
)

// SetWireIDs says what the ids of the wire format are (from
// schema_registry.kind and use_id; default ConfluentIDs). Call it before
// the first Decode.
func (d *Decoder) SetWireIDs(w WireIDs) { d.wire = w }

// The headers in which Apicurio's converter names a record's schema in
// its default framing (apicurio.registry.headers.enabled): an 8-byte id,
// and the key or value is bare Avro, without a magic byte.
const (
	ApicurioValueGlobalID  = "apicurio.value.globalId"
	ApicurioValueContentID = "apicurio.value.contentId"
	ApicurioKeyGlobalID    = "apicurio.key.globalId"
	ApicurioKeyContentID   = "apicurio.key.contentId"
)

// schemaRef names a writer schema in the registry: a Confluent id (or
// Apicurio content id, the same thing through its ccompat API) or an
// Apicurio global id. The two number spaces are distinct.
type schemaRef struct {
	id     int64
	global bool
}

func (r schemaRef) String() string {
	if r.global {
		return fmt.Sprintf("global id %d", r.id)
	}
	return fmt.Sprintf("schema id %d", r.id)
}

// frame finds an Avro record's schema and its Avro body: from Apicurio's
// headers (last one wins, as Kafka's lastHeader) or from the wire format.
// For a key, ok is false when neither applies (the key is JSON).
func (d *Decoder) frame(b []byte, hs []Header, key bool) (ref schemaRef, body []byte, ok bool, err error) {
	globalH, contentH := ApicurioValueGlobalID, ApicurioValueContentID
	if key {
		globalH, contentH = ApicurioKeyGlobalID, ApicurioKeyContentID
	}
	var hv []byte
	var hname string
	for _, h := range hs {
		if h.Key == globalH || h.Key == contentH {
			hname, hv = h.Key, h.Value
		}
	}
	if hname != "" {
		if len(hv) != 8 {
			return ref, nil, true, fmt.Errorf("header %s holds %d bytes, not an 8-byte schema id", hname, len(hv))
		}
		ref = schemaRef{id: int64(binary.BigEndian.Uint64(hv)), global: hname == globalH}
		if ref.global && d.wire == ConfluentIDs {
			return ref, nil, true, fmt.Errorf("the schema is named by Apicurio's header %s (a global id): set schema_registry.kind: apicurio", hname)
		}
		return ref, b, true, nil
	}
	if len(b) < 5 || b[0] != 0 {
		if key {
			return ref, nil, false, nil
		}
		return ref, nil, true, errors.New("not the Avro wire format (magic byte 0 and a schema id) and no apicurio.value.globalId or contentId header")
	}
	ref.global = d.wire == ApicurioGlobalIDs
	if d.wire != ConfluentIDs && len(b) >= 9 && binary.BigEndian.Uint32(b[1:5]) == 0 {
		// Apicurio's 8-byte ids: an id of 4 bytes is never 0, and an
		// 8-byte one never reaches 2^32.
		ref.id = int64(binary.BigEndian.Uint64(b[1:9]))
		return ref, b[9:], true, nil
	}
	ref.id = int64(binary.BigEndian.Uint32(b[1:5]))
	if ref.id == 0 {
		return ref, nil, true, errors.New("schema id 0 in the wire format: not a Confluent schema id (Apicurio's 8-byte ids? set schema_registry.kind: apicurio)")
	}
	return ref, b[5:], true, nil
}

// fetch asks the registry for the schema ref names.
func fetch(ctx context.Context, reg Registry, ref schemaRef) (sr.Schema, error) {
	if !ref.global {
		return reg.SchemaByID(ctx, int(ref.id))
	}
	g, ok := reg.(GlobalRegistry)
	if !ok {
		return sr.Schema{}, fmt.Errorf("%s: this registry serves no Apicurio global ids (set schema_registry.kind: apicurio)", ref)
	}
	return g.SchemaByGlobalID(ctx, ref.id)
}
