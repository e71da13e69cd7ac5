//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// log4j2 configuration: everything to stderr (random-uuid prints the id on
// stdout), warnings and up.
const log4j = `status = warn
appender.console.type = Console
appender.console.name = STDERR
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = STDERR
logger.connect.name = io.debezium
logger.connect.level = info
`

// broker is a single-node KRaft Apache Kafka.
type broker struct {
	dir, props string
	port       int
	proc       *proc
}

func java(cache string, heap string, args ...string) []string {
	return append([]string{"java", "-Xmx" + heap, "-XX:+UseSerialGC", "-Dlog4j2.configurationFile=" + filepath.Join(cache, "log4j2.properties"),
		"-cp", filepath.Join(cache, "lib", "kafka", "*")}, args...)
}

func writeLog4j(t *testing.T, cache string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(cache, "log4j2.properties"), []byte(log4j), 0o644); err != nil {
		t.Fatal(err)
	}
}

// startBroker formats a log directory and starts the broker on a free port.
func startBroker(t *testing.T, cache, dir string) *broker {
	t.Helper()
	b := &broker{dir: filepath.Join(dir, "kafka"), port: freePort(t)}
	ctrl := freePort(t)
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b.props = filepath.Join(dir, "server.properties")
	props := fmt.Sprintf(`process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:%[2]d
listeners=PLAINTEXT://127.0.0.1:%[1]d,CONTROLLER://127.0.0.1:%[2]d
advertised.listeners=PLAINTEXT://127.0.0.1:%[1]d
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=%[3]s
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
`, b.port, ctrl, b.dir)
	if err := os.WriteFile(b.props, []byte(props), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(java(cache, "256m", "kafka.tools.StorageTool", "random-uuid")[0],
		java(cache, "256m", "kafka.tools.StorageTool", "random-uuid")[1:]...).Output()
	if err != nil {
		t.Fatalf("kafka-storage random-uuid: %v", err)
	}
	id := strings.TrimSpace(string(out))
	format := java(cache, "256m", "kafka.tools.StorageTool", "format", "-t", id, "-c", b.props, "--standalone")
	if out, err := exec.Command(format[0], format[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("kafka-storage format: %v\n%s", err, out)
	}
	b.start(t, dir, cache)
	return b
}

func (b *broker) start(t *testing.T, dir, cache string) {
	t.Helper()
	start := time.Now()
	b.proc = startProc(t, dir, "kafka", java(cache, "512m", "kafka.Kafka", b.props))
	waitPort(t, b.proc, b.port, 60*time.Second)
	t.Logf("Apache Kafka 4.3.1 (KRaft) listening on 127.0.0.1:%d after %v", b.port, time.Since(start).Round(time.Millisecond))
}

func (b *broker) addr() string { return fmt.Sprintf("127.0.0.1:%d", b.port) }

// connect is Kafka Connect standalone running a Debezium connector
// (PostgreSQL's unless said otherwise).
type connect struct {
	worker, connector string
	more              []string // further connectors' configurations
	rest              int
	proc              *proc
	what              string // the connector, for the log
}

// jsonConverters are the worker's converters unless a test says otherwise:
// JsonConverter with schemas, Debezium's default.
const jsonConverters = `key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=true
value.converter.schemas.enable=true
`

// startConnect starts Connect with Debezium capturing tables of the source
// database into topics prefixed "shop", with the given converter
// properties ("": jsonConverters).
func startConnect(t *testing.T, cache, dir, bootstrap string, source sourceDB, tables, converters, extra string) *connect {
	t.Helper()
	connector := fmt.Sprintf(`name=shop-source
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname=127.0.0.1
database.port=%d
database.user=postgres
database.password=unused
database.dbname=%s
topic.prefix=shop
table.include.list=%s
plugin.name=pgoutput
slot.name=scd2sink_e2e
publication.name=scd2sink_e2e
publication.autocreate.mode=filtered
snapshot.mode=initial
poll.interval.ms=100
`, source.port, source.db, tables) + extra
	return startConnector(t, cache, dir, bootstrap, connector, converters, "Debezium 3.6.1.Final (postgresql connector)")
}

// startConnector starts Connect with the given connector properties.
func startConnector(t *testing.T, cache, dir, bootstrap, connector, converters, what string) *connect {
	t.Helper()
	c := &connect{worker: filepath.Join(dir, "worker.properties"), connector: filepath.Join(dir, "connector.properties"), rest: freePort(t), what: what}
	// Apicurio's converter jars carry no service manifest: the worker must
	// scan for them (slower to start).
	discovery := "service_load"
	if converters == "" {
		converters = jsonConverters
	} else {
		discovery = "hybrid_warn"
	}
	if strings.Contains(connector, "apicurio") {
		discovery = "hybrid_warn"
	}
	worker := fmt.Sprintf(`bootstrap.servers=%s
%soffset.storage.file.filename=%s
offset.flush.interval.ms=1000
plugin.path=%s
plugin.discovery=%s
listeners=http://127.0.0.1:%d
`, bootstrap, converters, filepath.Join(dir, "connect.offsets"), filepath.Join(cache, "plugins"), discovery, c.rest)
	if err := os.WriteFile(c.worker, []byte(worker), 0o644); err != nil {
		t.Fatal(err)
	}
	// Several connectors' configurations are separated by a "---" line.
	for i, conf := range strings.Split(connector, "\n---\n") {
		f := c.connector
		if i > 0 {
			f = filepath.Join(dir, fmt.Sprintf("connector%d.properties", i+1))
			c.more = append(c.more, f)
		}
		if err := os.WriteFile(f, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.start(t, dir, cache)
	return c
}

func (c *connect) start(t *testing.T, dir, cache string) {
	t.Helper()
	start := time.Now()
	c.proc = startProc(t, dir, "connect", java(cache, "512m", append([]string{"org.apache.kafka.connect.cli.ConnectStandalone", c.worker, c.connector}, c.more...)...))
	waitPort(t, c.proc, c.rest, 90*time.Second)
	t.Logf("Kafka Connect 4.3.1 with %s up after %v", c.what, time.Since(start).Round(time.Millisecond))
}

// codecCounter counts the record batches a client reads, by compression
// codec (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd).
type codecCounter struct {
	mu sync.Mutex
	n  map[uint8]int
}

func (c *codecCounter) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[m.CompressionType]++
}

// batchCodecs reads topic from its start to its end and counts its record
// batches by compression codec.
func batchCodecs(t *testing.T, ctx context.Context, addr, topic string) map[uint8]int {
	t.Helper()
	cc := &codecCounter{n: map[uint8]int{}}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.WithHooks(cc))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(want) > 0 && pctx.Err() == nil {
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return maps.Clone(cc.n)
}
