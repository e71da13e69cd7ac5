package debezium

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/sr"
)

// idRegistry serves schemas by content id and by Apicurio global id, from
// maps; the two number spaces overlap on purpose, so that a mix-up picks a
// wrong schema and fails.
type idRegistry struct {
	content map[int]string
	global  map[int64]string
	asked   []string
}

func (r *idRegistry) SchemaByID(_ context.Context, id int) (sr.Schema, error) {
	r.asked = append(r.asked, "content")
	if s, ok := r.content[id]; ok {
		return sr.Schema{Schema: s, Type: sr.TypeAvro}, nil
	}
	return sr.Schema{}, &sr.ResponseError{StatusCode: http.StatusNotFound, Message: "no content"}
}

func (r *idRegistry) SchemaByGlobalID(_ context.Context, id int64) (sr.Schema, error) {
	r.asked = append(r.asked, "global")
	if s, ok := r.global[id]; ok {
		return sr.Schema{Schema: s, Type: sr.TypeAvro}, nil
	}
	return sr.Schema{}, &sr.ResponseError{StatusCode: http.StatusNotFound, Message: "no artifact version"}
}

// confluentOnly hides SchemaByGlobalID, as franz-go's sr.Client has none.
type confluentOnly struct{ r *idRegistry }

func (c confluentOnly) SchemaByID(ctx context.Context, id int) (sr.Schema, error) {
	return c.r.SchemaByID(ctx, id)
}

// TestAvroFramings decodes one Debezium change in every framing Apicurio's
// and Confluent's converters write: ids in headers (bare Avro) or in the
// wire format with 4 or 8 bytes, global or content ids, keys Avro or JSON.
func TestAvroFramings(t *testing.T) {
	src := avroSource()
	other := `{"type":"record","name":"Other","fields":[{"name":"x","type":"string"}]}`
	// Content ids 3 (value) and 4 (key); global ids 11 and 12; content 11
	// and global 3 are other schemas.
	reg := &idRegistry{
		content: map[int]string{3: src.AvroValueSchema(), 4: src.AvroKeySchema(), 11: other, 12: other},
		global:  map[int64]string{11: src.AvroValueSchema(), 12: src.AvroKeySchema(), 3: other, 4: other},
	}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ch := scdtest.Change{Op: "u", Before: scdtest.Row{"id": 5, "plan": "free"}, After: scdtest.Row{"id": 5, "plan": "pro"}, LSN: 77, Commit: at}
	keyC, valC := src.AvroEnvelope(ch, 3, 4)   // content ids, 4-byte
	keyG, valG := src.AvroEnvelope(ch, 11, 12) // global ids, 4-byte
	jsonKey, _ := src.AvroEnvelope(ch, 3, 0)
	bodyC, idC := scdtest.ApicurioHeaders(valC)
	kbodyC, kidC := scdtest.ApicurioHeaders(keyC)
	bodyG, idG := scdtest.ApicurioHeaders(valG)
	kbodyG, kidG := scdtest.ApicurioHeaders(keyG)
	h := func(kv ...any) []Header {
		var out []Header
		for i := 0; i < len(kv); i += 2 {
			out = append(out, Header{Key: kv[i].(string), Value: kv[i+1].([]byte)})
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		wire       WireIDs
		confluent  bool // the registry has no global ids
		key, value []byte
		headers    []Header
		asked      string // what the registry was asked, value then key
		err        string // "" : decoded
	}{
		{name: "confluent wire format", wire: ConfluentIDs, confluent: true, key: keyC, value: valC, asked: "content,content"},
		{name: "apicurio headers, global ids (the converter's default)", wire: ApicurioGlobalIDs, key: kbodyG, value: bodyG,
			headers: h(ApicurioKeyGlobalID, kidG, ApicurioValueGlobalID, idG), asked: "global,global"},
		{name: "apicurio headers, content ids", wire: ApicurioGlobalIDs, key: kbodyC, value: bodyC,
			headers: h(ApicurioValueContentID, idC, ApicurioKeyContentID, kidC), asked: "content,content"},
		{name: "apicurio headers, JSON key", wire: ApicurioContentIDs, key: jsonKey, value: bodyG,
			headers: h(ApicurioValueGlobalID, idG), asked: "global"},
		{name: "apicurio headers, last header wins", wire: ApicurioGlobalIDs, key: jsonKey, value: bodyG,
			headers: h(ApicurioValueGlobalID, idC, ApicurioValueGlobalID, idG), asked: "global"},
		{name: "apicurio wire format, 8-byte global ids (DefaultIdHandler)", wire: ApicurioGlobalIDs,
			key: scdtest.ApicurioWire8(keyG), value: scdtest.ApicurioWire8(valG), asked: "global,global"},
		{name: "apicurio wire format, 8-byte content ids", wire: ApicurioContentIDs,
			key: scdtest.ApicurioWire8(keyC), value: scdtest.ApicurioWire8(valC), asked: "content,content"},
		{name: "apicurio wire format, 4-byte global ids (Legacy4ByteIdHandler)", wire: ApicurioGlobalIDs, key: keyG, value: valG, asked: "global,global"},
		{name: "apicurio wire format, 4-byte content ids (as-confluent)", wire: ApicurioContentIDs, key: keyC, value: valC, asked: "content,content"},
		{name: "confluent kind, apicurio content id header (ccompat API)", wire: ConfluentIDs, confluent: true, key: jsonKey, value: bodyC,
			headers: h(ApicurioValueContentID, idC), asked: "content"},
		{name: "confluent kind, apicurio global id header", wire: ConfluentIDs, confluent: true, key: jsonKey, value: bodyG,
			headers: h(ApicurioValueGlobalID, idG), err: "set schema_registry.kind: apicurio"},
		{name: "confluent kind, 8-byte ids", wire: ConfluentIDs, confluent: true, key: jsonKey, value: scdtest.ApicurioWire8(valC),
			err: "schema id 0"},
		{name: "apicurio, header of 7 bytes", wire: ApicurioGlobalIDs, key: jsonKey, value: bodyG,
			headers: h(ApicurioValueGlobalID, idG[1:]), err: "holds 7 bytes"},
		{name: "bare Avro without a header", wire: ApicurioGlobalIDs, key: jsonKey, value: bodyG, err: "no apicurio.value.globalId"},
		{name: "global id unknown: a dead letter after the lookup timeout", wire: ApicurioGlobalIDs, key: jsonKey, value: bodyG,
			headers: h(ApicurioValueGlobalID, []byte{0, 0, 0, 0, 0, 0, 0, 99}), err: "global id 99 is not in the schema registry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg.asked = nil
			var r Registry = reg
			if tc.confluent {
				r = confluentOnly{reg}
			}
			d := New([]Rule{{Topic: src.Topic(), Target: "customers_history", Format: FormatAvro,
				SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, r, nil)
			d.SetWireIDs(tc.wire)
			d.SetLookupTimeout(0)
			o := change.Origin{Partition: change.Partition{Topic: src.Topic()}}
			ev, err := d.Decode(context.Background(), o, tc.key, tc.value, tc.headers...)
			if tc.err != "" {
				if err == nil || errors.Is(err, ErrRetry) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ev.Op != change.OpUpdate || afterOf(ev)["plan"] != "pro" || len(ev.Key) != 1 || ev.Key[0] != int32(5) ||
				ev.Seq.String() != "[77]" || !ev.ValidFrom.Equal(at) {
				t.Fatalf("event %+v", ev)
			}
			if got := strings.Join(reg.asked, ","); got != tc.asked {
				t.Errorf("registry asked for %s ids, want %s", got, tc.asked)
			}
		})
	}
}
