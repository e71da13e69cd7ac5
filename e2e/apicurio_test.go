//go:build e2e

package e2e

import (
	"context"
	bin "encoding/binary"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// startApicurio starts Apicurio Registry 2.4.2 (in-memory storage, built
// by fetch.sh) on port, reserved until now (release), and waits for its
// API: its own answer, not just something listening on the port.
func startApicurio(t *testing.T, dir string, port int, release func()) *proc {
	t.Helper()
	start := time.Now()
	release()
	p := startProc(t, dir, "apicurio", []string{"java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Dquarkus.http.host=127.0.0.1", fmt.Sprintf("-Dquarkus.http.port=%d", port),
		"-jar", filepath.Join(cache, "apicurio-registry", "apicurio-registry-runner.jar")})
	waitPort(t, p, port, 90*time.Second)
	info := fmt.Sprintf("http://127.0.0.1:%d/apis/registry/v2/system/info", port)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if p.exited() {
			t.Fatalf("apicurio exited:\n%s", p.tail(40))
		}
		if resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(info); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(strings.ToLower(string(body)), "apicurio") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Apicurio's API never answered at %s:\n%s", info, p.tail(40))
		}
	}
	t.Logf("Apicurio Registry 2.4.2.Final up after %v", time.Since(start).Round(time.Millisecond))
	return p
}

// TestApicurioAvro: Debezium writes Avro through Apicurio's AvroConverter
// 2.6.13 in its default framing (the schema's global id in the
// apicurio.*.globalId headers, the key and value bare Avro) against
// Apicurio Registry 2.4.2; scd2sink, with schema_registry.kind apicurio,
// keeps a history equal to the source's audit log, primary-key changes
// included, with no dead letter.
func TestApicurioAvro(t *testing.T) {
	skipOnCompose(t)
	ctx := context.Background()
	port, release := reservePort(t)
	api := fmt.Sprintf("http://127.0.0.1:%d/apis/registry/v2", port)
	var reg *proc
	converters := ""
	for _, side := range []string{"key", "value"} {
		converters += fmt.Sprintf(`%[1]s.converter=io.apicurio.registry.utils.converter.AvroConverter
%[1]s.converter.apicurio.registry.url=%[2]s
%[1]s.converter.apicurio.registry.auto-register=true
%[1]s.converter.apicurio.registry.find-latest=true
`, side, api)
	}
	// Avro records compressed with zstd by Connect's producer (pool.go).
	st := newStackWith(t, ctx, stackOpts{partitions: 1, converters: converters, connector: "producer.override.compression.type=zstd\n",
		before: func(st *stack) { reg = startApicurio(t, st.dir, port, release) }})
	sinkProc := runSinkWith(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN, fmt.Sprintf(`defaults:
  format: debezium-avro
schema_registry:
  kind: apicurio
  url: %q
`, api))
	w := newWorkload(5)
	if err := w.run(ctx, st.src.pool, 200, 300); err != nil {
		t.Fatal(err)
	}
	t.Logf("Avro through Apicurio: history equals the source's audit log, %d versions", st.converge(t, ctx, 120*time.Second, sinkProc, st.conn.proc, reg))
	if codecs := batchCodecs(t, ctx, st.kafka.addr(), "shop.public.customers"); codecs[4] == 0 || len(codecs) != 1 {
		t.Fatalf("the topic's record batches by codec: %v; want zstd (4) only", codecs)
	}
	checkKeyChanges(t, ctx, st, w, 2)
	n := st.converge(t, ctx, 30*time.Second, sinkProc, st.conn.proc, reg)
	var dead int
	if err := st.tpool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_dead_letters`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Fatalf("%d dead letters", dead)
	}
	// The records really are in the converter's headers framing.
	cl, err := kgo.NewClient(kgo.SeedBrokers(st.kafka.addr()), kgo.ConsumeTopics("shop.public.customers"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var first *kgo.Record
	for first == nil && fctx.Err() == nil {
		cl.PollFetches(fctx).EachRecord(func(r *kgo.Record) {
			if first == nil && len(r.Value) > 0 {
				first = r
			}
		})
	}
	if first == nil {
		t.Fatal("no record read back")
	}
	var ids []string
	for _, h := range first.Headers {
		if len(h.Value) == 8 {
			ids = append(ids, fmt.Sprintf("%s=%d", h.Key, bin.BigEndian.Uint64(h.Value)))
		}
	}
	if len(ids) != 2 {
		t.Fatalf("the first record's headers %v: not Apicurio's key and value global ids", first.Headers)
	}
	t.Logf("Debezium + Apicurio's converter (headers %v, value starting %#x): history equals the source, %d versions, no dead letter",
		ids, first.Value[:1], n)
}
