package debezium

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// Debezium writes a nullable decimal with a database default as the
// decimal first and a bytes default; goavro refuses such schemas, the
// decoder reads them (defaults play no part with the writer's schema).
func TestAvroDecimalDefaultsGoavroRefuses(t *testing.T) {
	for _, def := range []string{`"AA=="`, `"\u0000"`} {
		schema := `{"type":"record","name":"Value","namespace":"shop.public.t","fields":[
			{"name":"id","type":"int"},
			{"name":"price","type":[{"type":"bytes","scale":2,"precision":10,"connect.version":1,
				"connect.parameters":{"scale":"2","connect.decimal.precision":"10"},
				"connect.name":"org.apache.kafka.connect.data.Decimal","logicalType":"decimal"},"null"],"default":` + def + `}]}`
		if _, err := goavro.NewCodec(schema); err == nil {
			t.Errorf("goavro accepts the default %s: this regression test no longer shows the problem", def)
		}
		s := buildAvro(sr.Schema{Schema: schema, Type: sr.TypeAvro}, false)
		if s.err != nil {
			t.Fatalf("default %s: %v", def, s.err)
		}
		if c := s.row.byName["price"]; c == nil || c.kind != kDecimal || c.scale != 2 || !c.union {
			t.Fatalf("default %s: price column %+v", def, c)
		}
	}
}

func avroSource() *scdtest.Source {
	return &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "plan", Schema: `{"type":"string","optional":true}`}}}
}

func TestAvroRegistryFailures(t *testing.T) {
	src := avroSource()
	reg := srfake.New()
	t.Cleanup(reg.Close)
	reg.SeedSchema(src.Topic()+"-value", 1, 7, sr.Schema{Schema: src.AvroValueSchema(), Type: sr.TypeAvro})
	var fails atomic.Int64
	failing := func(w http.ResponseWriter, r *http.Request) bool {
		if fails.Load() > 0 {
			fails.Add(-1)
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return true
		}
		return false
	}
	reg.Intercept(failing)
	restore := func() { reg.ClearInterceptors(); reg.Intercept(failing) }
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	registryBackoffMin, registryBackoffMax = time.Millisecond, 10*time.Millisecond
	d := New([]Rule{{Topic: src.Topic(), Target: "customers_history", Format: FormatAvro,
		SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, cl, nil)
	o := change.Origin{Partition: change.Partition{Topic: src.Topic()}}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key, value := src.AvroEnvelope(scdtest.Change{Op: "c", After: scdtest.Row{"id": 1, "plan": "pro"}, LSN: 10, Commit: at}, 7, 0)

	t.Run("unreachable, then back: retried, not dead-lettered", func(t *testing.T) {
		fails.Store(5)
		ev, err := d.Decode(context.Background(), o, key, value)
		if err != nil {
			t.Fatal(err)
		}
		if afterOf(ev)["plan"] != "pro" || ev.Key[0] != int32(1) || ev.Seq.String() != "[10]" || !ev.ValidFrom.Equal(at) {
			t.Fatalf("event %+v", ev)
		}
		// The digest is that of the image as a map (what scd_hash holds
		// for Avro events written before AfterValues), and covers it.
		if ev.Hash() != change.ContentHash(ev.Op, ev.ValidFrom, afterOf(ev)) || ev.Hash() == change.ContentHash(ev.Op, ev.ValidFrom, nil) {
			t.Fatalf("hash %x is not the image's", ev.Hash())
		}
	})
	t.Run("unreachable until shutdown: ErrRetry", func(t *testing.T) {
		d := New(d.ruleList(), cl, nil) // an empty cache
		fails.Store(1 << 30)
		defer fails.Store(0)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := d.Decode(ctx, o, key, value); !errors.Is(err, ErrRetry) {
			t.Fatalf("got %v, want ErrRetry", err)
		}
	})
	t.Run("unknown schema id: waits for the lookup timeout, then a dead letter", func(t *testing.T) {
		d := New(d.ruleList(), cl, nil)
		d.SetLookupTimeout(300 * time.Millisecond)
		var asked atomic.Int64
		reg.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
			if strings.Contains(r.URL.Path, "/schemas/ids/99") {
				asked.Add(1)
			}
			return false
		})
		defer restore()
		bad := append([]byte{0, 0, 0, 0, 99}, value[5:]...)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := d.Decode(ctx, o, key, bad); !errors.Is(err, ErrRetry) {
			t.Fatalf("within the lookup timeout: got %v, want ErrRetry (the record waits)", err)
		}
		_, err := d.Decode(context.Background(), o, key, bad)
		if err == nil || errors.Is(err, ErrRetry) || !strings.Contains(err.Error(), "schema id 99 is not in the schema registry") {
			t.Fatalf("after the lookup timeout: got %v, want a permanent error naming the id", err)
		}
		n := asked.Load()
		for i := 0; i < 100; i++ {
			if _, err := d.Decode(context.Background(), o, key, bad); err == nil || errors.Is(err, ErrRetry) {
				t.Fatalf("got %v", err)
			}
		}
		if asked.Load() != n {
			t.Errorf("100 more records with the unknown id asked the registry %d more times; the answer is remembered", asked.Load()-n)
		}
	})
	t.Run("an outage longer than the lookup timeout, then 40403 once: not a dead letter", func(t *testing.T) {
		d := New(d.ruleList(), cl, nil)
		d.SetLookupTimeout(200 * time.Millisecond)
		start := time.Now()
		var notFound atomic.Int64
		notFound.Store(1)
		reg.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
			if !strings.Contains(r.URL.Path, "/schemas/ids/") {
				return false
			}
			if time.Since(start) < 400*time.Millisecond {
				http.Error(w, "unavailable", http.StatusServiceUnavailable)
				return true
			}
			if notFound.Add(-1) >= 0 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				_, _ = w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
				return true
			}
			return false
		})
		defer restore()
		ev, err := d.Decode(context.Background(), o, key, value)
		if err != nil || afterOf(ev)["plan"] != "pro" {
			t.Fatalf("got %v, %v", ev, err)
		}
	})
	t.Run("unknown for a moment (a follower behind), then known: decoded", func(t *testing.T) {
		d := New(d.ruleList(), cl, nil)
		d.SetLookupTimeout(time.Minute)
		var misses atomic.Int64
		misses.Store(20)
		reg.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
			if misses.Load() > 0 && strings.Contains(r.URL.Path, "/schemas/ids/") {
				misses.Add(-1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				_, _ = w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
				return true
			}
			return false
		})
		defer restore()
		ev, err := d.Decode(context.Background(), o, key, value)
		if err != nil || afterOf(ev)["plan"] != "pro" {
			t.Fatalf("got %v, %v", ev, err)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		for name, v := range map[string][]byte{
			"no magic byte": append([]byte{1}, value[1:]...),
			"short":         {0, 0, 0},
			"truncated":     value[:len(value)-3],
			"extra bytes":   append(append([]byte(nil), value...), 1, 2, 3),
		} {
			if _, err := d.Decode(context.Background(), o, key, v); err == nil || errors.Is(err, ErrSkip) || errors.Is(err, ErrRetry) {
				t.Errorf("%s: got %v, want an error", name, err)
			}
		}
		if _, err := d.Decode(context.Background(), o, key, nil); !errors.Is(err, ErrSkip) {
			t.Errorf("tombstone: got %v, want ErrSkip", err)
		}
	})
}

// afterOf is an event's row image as a map, however the decoder kept it.
func afterOf(ev *change.Event) map[string]any {
	m, _ := ev.DecodeAfter()
	return m
}
