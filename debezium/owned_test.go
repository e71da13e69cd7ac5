package debezium_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
)

// TestDecodedEventsOwnTheirMemory: the consumer hands a record's bytes back
// to franz-go's decompression pool once the record is decoded, so nothing
// a decoded event or the decoder's caches keep may alias the record's key,
// value or headers. Each input is decoded from buffers of its own that are
// overwritten right after; every event (its row image decoded too) must
// stay as it was decoded, and equal what a decoder given untouched inputs
// decodes.
func TestDecodedEventsOwnTheirMemory(t *testing.T) {
	type input struct {
		k, v  []byte
		hs    []debezium.Header
		topic string // "": src's
	}
	src, recs := envelopes(60)
	rule := debezium.Rule{Topic: src.Topic(), Target: "customers_history", SequenceBy: []string{"source.sequence", "source.lsn"}, ValidFrom: "source.ts_ms"}
	var jsonIn, schemaless, avro []input
	for _, r := range recs {
		jsonIn = append(jsonIn, input{k: r[0], v: r[1]})
	}
	fixtures, _ := filepath.Glob("testdata/*.key.json")
	for _, kf := range fixtures {
		k, err1 := os.ReadFile(kf)
		v, err2 := os.ReadFile(strings.TrimSuffix(kf, ".key.json") + ".value.json")
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		jsonIn = append(jsonIn, input{k: k, v: v})
	}
	at := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	more := []scdtest.Change{
		{Op: "d", Before: customerRow(3), LSN: 30000000, Commit: at},
		{Op: "c", After: customerRow(7), LSN: 30000056, Commit: at},
		{Op: "u", After: scdtest.Row{"id": 7, "name": "é\"q\\u", "bio": change.Unavailable, "attrs": `{"a":"\"x\""}`}, LSN: 30000112, Commit: at},
	}
	for i, c := range more {
		k, v := src.Envelope(c)
		in := input{k: k, v: v}
		if i == 1 {
			in.hs = []debezium.Header{{Key: debezium.OldKeyHeader, Value: []byte(`{"id":3}`)}, {Key: "other", Value: []byte("x")}}
		}
		jsonIn = append(jsonIn, in)
	}
	for _, c := range append(append([]scdtest.Change(nil), avroChanges...), more...) {
		k, v := src.Schemaless(c)
		schemaless = append(schemaless, input{k: k, v: v})
		k, v = src.AvroEnvelope(c, 1, 2)
		avro = append(avro, input{k: k, v: v})
		k, v = src.AvroEnvelope(c, 1, 0) // a JSON key
		avro = append(avro, input{k: k, v: v})
	}
	// A truncate, a snapshot's last read (it names the table), and an
	// update whose sequence is Debezium's array of strings.
	jsonIn = append(jsonIn,
		input{v: []byte(`{"before":null,"after":null,"source":{"version":"3.6.0.Final","connector":"postgresql","name":"shop","db":"shop","schema":"public","table":"customers","lsn":40000000,"ts_ms":1767225600000,"sequence":"[\"39999000\",\"40000000\"]"},"op":"t"}`)},
		input{k: []byte(`{"id":9}`), v: []byte(`{"before":null,"after":{"id":9,"name":"n"},"source":{"version":"3.6.0.Final","connector":"postgresql","name":"shop","db":"shop","schema":"public","table":"customers","snapshot":"last","lsn":40000056,"ts_ms":1767225600000},"op":"r"}`)},
		input{k: []byte(`{"id":9}`), v: []byte(`{"before":{"id":9},"after":{"id":9,"name":"m"},"source":{"name":"shop","db":"shop","lsn":40000112,"ts_ms":1767225600001,"sequence":"[null,\"40000112\"]"},"op":"u"}`)})
	// A key of strings (escaped, too), in a record key and in a delete's before image.
	items := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "items", Keys: []string{"shop", "sku"},
		Cols: []scdtest.Col{{Name: "shop", Schema: `{"type":"string","optional":false}`}, {Name: "sku", Schema: `{"type":"string","optional":false}`},
			{Name: "qty", Schema: `{"type":"int32","optional":true}`}}}
	itemRule := debezium.Rule{Topic: items.Topic(), Target: "items_history", SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}
	for _, c := range []scdtest.Change{
		{Op: "c", After: scdtest.Row{"shop": "north", "sku": "A-1", "qty": 3}, LSN: 100, Commit: at},
		{Op: "u", After: scdtest.Row{"shop": "n\"o\u00e9", "sku": "B\n2", "qty": 4}, LSN: 156, Commit: at},
		{Op: "d", Before: scdtest.Row{"shop": "north", "sku": "A-1"}, LSN: 212, Commit: at},
	} {
		k, v := items.Envelope(c)
		jsonIn = append(jsonIn, input{k: k, v: v, topic: items.Topic()})
		k, v = items.Schemaless(c)
		schemaless = append(schemaless, input{k: k, v: v, topic: items.Topic()})
	}
	// Avro bytes: a key of bytes, a bytes column and an array of bytes
	// (goavro's bytes view the record they were decoded from).
	blobs := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "blobs", Keys: []string{"k"},
		Cols: []scdtest.Col{{Name: "k", Schema: `{"type":"bytes","optional":false}`}, {Name: "data", Schema: `{"type":"bytes","optional":true}`},
			{Name: "parts", Schema: `{"type":"array","optional":true,"items":{"type":"bytes","optional":true}}`}}}
	blobRule := debezium.Rule{Topic: blobs.Topic(), Target: "blobs_history", Format: debezium.FormatAvro, SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}
	var avroBytes []input
	for i, c := range []scdtest.Change{
		{Op: "c", After: scdtest.Row{"k": "AAEC", "data": "3q2+7w==", "parts": []any{"AQ==", "AgM="}}, LSN: 100, Commit: at},
		{Op: "u", After: scdtest.Row{"k": "AAEC", "data": "", "parts": []any{}}, LSN: 156, Commit: at},
		{Op: "c", After: scdtest.Row{"k": "/w==", "data": nil, "parts": nil}, LSN: 212, Commit: at},
	} {
		k, v := blobs.AvroEnvelope(c, 1, 2)
		avroBytes = append(avroBytes, input{k: k, v: v, topic: blobs.Topic()})
		if i == 0 {
			k, v = blobs.AvroEnvelope(c, 1, 0) // a JSON key of bytes (base64)
			avroBytes = append(avroBytes, input{k: k, v: v, topic: blobs.Topic()})
		}
	}
	var bench []input
	benchRules := []debezium.Rule{}
	for _, s := range []*scdtest.Source{scdtest.BenchCustomers(), scdtest.BenchAccounts()} {
		benchRules = append(benchRules, debezium.Rule{Topic: s.Topic(), Target: s.Table + "_history", SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"})
	}
	work := scdtest.BenchWorkload(rand.New(rand.NewPCG(5, 6)), 100, 400)
	for _, w := range work {
		if !w.Tombstone {
			k, v := w.Src.Envelope(w.Change)
			bench = append(bench, input{k: k, v: v, topic: w.Src.Topic()})
		}
	}
	avroRule := rule
	avroRule.Format = debezium.FormatAvro
	for _, tc := range []struct {
		name   string
		dec    func() *debezium.Decoder
		inputs []input
	}{
		{"json", func() *debezium.Decoder { return debezium.New([]debezium.Rule{rule, itemRule}, nil, nil) }, jsonIn},
		{"schemaless", func() *debezium.Decoder { return debezium.New([]debezium.Rule{rule, itemRule}, nil, nil) }, schemaless},
		{"avro", func() *debezium.Decoder { return debezium.New([]debezium.Rule{avroRule}, avroRegistry(t, src), nil) }, avro},
		{"avro-bytes", func() *debezium.Decoder { return debezium.New([]debezium.Rule{blobRule}, avroRegistry(t, blobs), nil) }, avroBytes},
		{"bench", func() *debezium.Decoder { return debezium.New(benchRules, nil, nil) }, bench},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clean, poisoned := tc.dec(), tc.dec()
			var kept []*change.Event
			var dumps []string
			decoded := 0
			for i, in := range tc.inputs {
				topic := cmp.Or(in.topic, src.Topic())
				o := change.Origin{Partition: change.Partition{Topic: topic}, Offset: int64(i)}
				want, werr := clean.Decode(context.Background(), o, in.k, in.v, in.hs...)
				k, v := append([]byte(nil), in.k...), append([]byte(nil), in.v...)
				hs := make([]debezium.Header, len(in.hs))
				for j, h := range in.hs {
					hs[j] = debezium.Header{Key: h.Key, Value: append([]byte(nil), h.Value...)}
				}
				ev, err := poisoned.Decode(context.Background(), o, k, v, hs...)
				for _, b := range append([][]byte{k, v}, headerValues(hs)...) {
					for j := range b {
						b[j] = 0xFF
					}
				}
				if (err == nil) != (werr == nil) {
					t.Fatalf("input %d: %v, untouched %v", i, err, werr)
				}
				if err != nil {
					continue
				}
				decoded++
				got, exp := dumpEvent(ev), dumpEvent(want)
				if got != exp {
					t.Fatalf("input %d: decoded from overwritten bytes:\n%s\nuntouched:\n%s", i, got, exp)
				}
				kept, dumps = append(kept, ev), append(dumps, got)
			}
			for i, ev := range kept {
				if got := dumpEvent(ev); got != dumps[i] {
					t.Fatalf("event %d changed when the bytes it was decoded from were overwritten:\n%s\nwas:\n%s", i, got, dumps[i])
				}
			}
			// The schema cache keeps texts it compares later messages
			// with: overwritten, they could match another schema's text.
			cache := func(d *debezium.Decoder) string {
				var b strings.Builder
				dumpValue(&b, reflect.ValueOf(d).Elem().FieldByName("schemas"), map[uintptr]bool{}, 0)
				return b.String()
			}
			if got, want := cache(poisoned), cache(clean); got != want {
				t.Fatalf("the schema cache changed with the bytes it was given:\n%s\nuntouched:\n%s", got, want)
			}
			if decoded < len(tc.inputs)/2 {
				t.Fatalf("only %d of %d inputs decoded", decoded, len(tc.inputs))
			}
		})
	}
}

func headerValues(hs []debezium.Header) [][]byte {
	var out [][]byte
	for _, h := range hs {
		out = append(out, h.Value)
	}
	return out
}

// dumpEvent renders everything reachable from ev, its row image decoded.
func dumpEvent(ev *change.Event) string {
	ev.Hash()
	row, err := ev.DecodeAfter()
	var b strings.Builder
	dumpValue(&b, reflect.ValueOf(ev), map[uintptr]bool{}, 0)
	fmt.Fprintf(&b, "\nrow %v: ", err)
	dumpValue(&b, reflect.ValueOf(row), map[uintptr]bool{}, 0)
	return b.String()
}

// dumpValue writes v's content, following pointers, interfaces, slices and
// maps (unexported fields too); a pointer seen before is written once.
func dumpValue(b *strings.Builder, v reflect.Value, seen map[uintptr]bool, depth int) {
	if depth > 40 {
		b.WriteString("…")
		return
	}
	switch v.Kind() {
	case reflect.Invalid:
		b.WriteString("<nil>")
	case reflect.Bool:
		fmt.Fprint(b, v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		fmt.Fprint(b, v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		fmt.Fprint(b, v.Uint())
	case reflect.Float32, reflect.Float64:
		fmt.Fprint(b, v.Float())
	case reflect.String:
		fmt.Fprintf(b, "%q", v.String())
	case reflect.Pointer:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		if seen[v.Pointer()] {
			b.WriteString("(seen)")
			return
		}
		seen[v.Pointer()] = true
		b.WriteString("&")
		dumpValue(b, v.Elem(), seen, depth+1)
	case reflect.Interface:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		fmt.Fprintf(b, "(%s)", v.Elem().Type())
		dumpValue(b, v.Elem(), seen, depth+1)
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			b.WriteString("nil")
			return
		}
		if v.Type().Elem().Kind() == reflect.Uint8 && v.Kind() == reflect.Slice {
			fmt.Fprintf(b, "%q", v.Bytes())
			return
		}
		b.WriteString("[")
		for i := range v.Len() {
			dumpValue(b, v.Index(i), seen, depth+1)
			b.WriteString(" ")
		}
		b.WriteString("]")
	case reflect.Struct:
		b.WriteString("{")
		for i := range v.NumField() {
			switch typ := v.Type().Field(i).Type.String(); {
			case strings.HasPrefix(typ, "sync."), strings.HasPrefix(typ, "atomic."), typ == "maphash.Seed":
				continue // locks, and a seed each instance draws
			}
			b.WriteString(v.Type().Field(i).Name + ":")
			dumpValue(b, v.Field(i), seen, depth+1)
			b.WriteString(" ")
		}
		b.WriteString("}")
	case reflect.Map:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		var parts []string
		it := v.MapRange()
		for it.Next() {
			var kb, vb strings.Builder
			if v.Type().Key().Kind() != reflect.Uint64 { // a hash's value depends on its seed
				dumpValue(&kb, it.Key(), seen, depth+1)
			}
			dumpValue(&vb, it.Value(), map[uintptr]bool{}, depth+1)
			parts = append(parts, kb.String()+"="+vb.String())
		}
		sort.Strings(parts)
		b.WriteString("map[" + strings.Join(parts, " ") + "]")
	default:
		fmt.Fprintf(b, "<%s>", v.Type())
	}
}
