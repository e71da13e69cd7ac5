package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const minimal = `
kafka:
  brokers: ["127.0.0.1:9092"]
postgres:
  dsn: "postgres://user:s3cret@127.0.0.1:5432/db"
tables:
  - topic: shop.public.customers
`

func noEnv(string) (string, bool) { return "", false }

func TestDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	tb := c.Tables[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"group", c.Kafka.GroupID, "scd2sink"},
		{"start", c.Kafka.StartOffset, "earliest"},
		{"schema", c.Postgres.Schema, "public"},
		{"window", c.Sequencer.ReorderWindow, 2 * time.Second},
		{"buffer", c.Sequencer.MaxBufferedEvents, 200000},
		{"batch", c.Sink.BatchMaxEvents, 10000},
		{"wait", c.Sink.BatchMaxWait, 250 * time.Millisecond},
		{"dead letters", c.Sink.DeadLetterTable, "scd2sink_dead_letters"},
		{"http", c.HTTPAddr(), "127.0.0.1:9464"},
		{"shutdown", c.ShutdownTimeout, 30 * time.Second},
		{"lock timeout", c.Postgres.LockTimeout, 5 * time.Second},
		{"statement timeout", c.Postgres.StatementTimeout, 5 * time.Minute},
		{"batch bytes", c.Sink.BatchMaxBytes, ByteSize(64 << 20)},
		{"target", tb.Target, "customers_history"},
		{"format", tb.Format, "debezium-json"},
		{"sequence", strings.Join(tb.SequenceBy, ","), "source.lsn"},
		{"valid_from", tb.ValidFrom, "source.ts_ms"},
		{"scope", tb.Type1Scope, "all_versions"},
		{"deletes", tb.Deletes, "close"},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s: got %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

func TestDefaultsBlockAndConnector(t *testing.T) {
	c, err := Parse([]byte(minimal+`
  - topic: inv.dbo.items
    connector: sqlserver
    deletes: new_record
defaults:
  connector: mysql
  deletes: ignore
  type1_scope: current_version
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Tables[0].SequenceBy, ","); got != "source.file,source.pos,source.row" || c.Tables[0].Deletes != "ignore" {
		t.Errorf("table 0: %v %s", got, c.Tables[0].Deletes)
	}
	if got := strings.Join(c.Tables[1].SequenceBy, ","); got != "source.commit_lsn,source.change_lsn,source.event_serial_no" ||
		c.Tables[1].Deletes != "new_record" || c.Tables[1].Type1Scope != "current_version" {
		t.Errorf("table 1: %v %s %s", got, c.Tables[1].Deletes, c.Tables[1].Type1Scope)
	}
}

// Every connector has a default sequence_by (DESIGN.md section 3,
// docs/sources.md).
func TestConnectorDefaults(t *testing.T) {
	want := map[string]string{
		"postgresql": "source.lsn",
		"mysql":      "source.file,source.pos,source.row",
		"mariadb":    "source.gtid,source.file,source.pos,source.row",
		"sqlserver":  "source.commit_lsn,source.change_lsn,source.event_serial_no",
		"oracle":     "source.commit_scn,source.scn,source.rs_id,source.ssn",
		"mongodb":    "source.ts_ms,source.ord",
	}
	for _, conn := range Connectors {
		c, err := Parse([]byte(minimal+"    connector: "+conn+"\n"), noEnv)
		if err != nil {
			t.Fatalf("%s: %v", conn, err)
		}
		if got := strings.Join(c.Tables[0].SequenceBy, ","); got != want[conn] {
			t.Errorf("%s: sequence_by %s, want %s", conn, got, want[conn])
		}
	}
	if len(want) != len(Connectors) {
		t.Errorf("connectors %v, want those of %v", Connectors, want)
	}
}

func TestEnvOverrides(t *testing.T) {
	env := map[string]string{
		"SCD2SINK_KAFKA_BROKERS":       "a:1, b:2",
		"SCD2SINK_POSTGRES_DSN":        "postgres://other@h/db",
		"SCD2SINK_KAFKA_SASL_PASSWORD": "pw",
		"SCD2SINK_LOG_LEVEL":           "debug",
		"SCD2SINK_HTTP_ADDR":           "",
	}
	c, err := Parse([]byte(minimal), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Kafka.Brokers, ",") != "a:1,b:2" || c.Postgres.DSN != env["SCD2SINK_POSTGRES_DSN"] ||
		c.Kafka.SASL.Password != "pw" || c.Log.Level != "debug" || c.HTTPAddr() != "" {
		t.Fatalf("overrides not applied: %+v", c)
	}
}

// TestBadValues: every key's bad value is an *Error naming that key, and no
// message carries the DSN's password.
func TestBadValues(t *testing.T) {
	tests := []struct {
		name, yaml, key string
	}{
		{"unknown top key", minimal + "colour: blue\n", "colour"},
		{"misspelled nested key", strings.Replace(minimal, "brokers:", "broker:", 1), "kafka.broker"},
		{"unknown table key", minimal + "    targt: x\n", "tables[0].targt"},
		{"no brokers", strings.Replace(minimal, `["127.0.0.1:9092"]`, "[]", 1), "kafka.brokers"},
		{"broker without port", strings.Replace(minimal, `127.0.0.1:9092`, "kafka", 1), "kafka.brokers[0]"},
		{"start offset", minimal + "  start_offset: middle\n", ""},
		{"session timeout", strings.Replace(minimal, "postgres:", "  session_timeout: 10ms\npostgres:", 1), "kafka.session_timeout"},
		{"dsn missing", strings.Replace(minimal, `dsn: "postgres://user:s3cret@127.0.0.1:5432/db"`, `schema: public`, 1), "postgres.dsn"},
		{"dsn invalid", strings.Replace(minimal, `postgres://user:s3cret@127.0.0.1:5432/db`, "postgres://user:s3cret@127.0.0.1:notaport/db", 1), "postgres.dsn"},
		{"schema", minimal + "sequencer:\n  reorder_window: -1s\n", "sequencer.reorder_window"},
		{"duration", minimal + "sequencer:\n  reorder_window: soon\n", "sequencer.reorder_window"},
		{"quiet_after", minimal + "sequencer:\n  quiet_after: -1s\n", "sequencer.quiet_after"},
		{"number", minimal + "sink:\n  batch_max_events: many\n", "sink.batch_max_events"},
		{"list", minimal + "    keys: id\n", "tables[0].keys"},
		{"mongodb keys", minimal + "    connector: mongodb\n    keys: [customer_id]\n", "tables[0].keys"},
		{"buffer", minimal + "sequencer:\n  max_buffered_events: -5\n", "sequencer.max_buffered_events"},
		{"buffer bytes", minimal + "sequencer:\n  max_buffered_bytes: 1000\n", "sequencer.max_buffered_bytes"},
		{"view name", minimal + "    views: [{name: \"" + strings.Repeat("v", 64) + "\"}]\n", "tables[0].views[0].name"},
		{"view grain", minimal + "    views: [{name: v, grain: week}]\n", "tables[0].views[0].grain"},
		{"view end", minimal + "    views: [{name: v, end: closed}]\n", "tables[0].views[0].end"},
		{"view zone", minimal + "    views: [{name: v, time_zone: Mars/Olympus}]\n", "tables[0].views[0].time_zone"},
		{"view current end", minimal + "    views: [{name: v, current_end: someday}]\n", "tables[0].views[0].current_end"},
		{"view deleted", minimal + "    views: [{name: v, deleted: maybe}]\n", "tables[0].views[0].deleted"},
		{"view renames", minimal + "    views: [{name: v, columns: {valid_from: d, valid_to: d}}]\n", "tables[0].views[0].columns"},
		{"view twice", minimal + "    views: [{name: v}, {name: v}]\n", "tables[0].views[1].name"},
		{"batch", minimal + "sink:\n  batch_max_events: -1\n", "sink.batch_max_events"},
		{"apply workers", minimal + "sink:\n  apply_workers: -1\n", "sink.apply_workers"},
		{"wait", minimal + "sink:\n  batch_max_wait: -1ms\n", "sink.batch_max_wait"},
		{"dead letter table", minimal + "sink:\n  dead_letter_table: \"a;b\"\n", "sink.dead_letter_table"},
		{"http", minimal + "http:\n  addr: nowhere\n", "http.addr"},
		{"log level", minimal + "log:\n  level: loud\n", "log.level"},
		{"log format", minimal + "log:\n  format: xml\n", "log.format"},
		{"shutdown", minimal + "shutdown_timeout: -1s\n", "shutdown_timeout"},
		{"sasl mechanism", strings.Replace(minimal, "postgres:", "  sasl: {mechanism: MAGIC}\npostgres:", 1), "kafka.sasl.mechanism"},
		{"sasl username", strings.Replace(minimal, "postgres:", "  sasl: {mechanism: PLAIN}\npostgres:", 1), "kafka.sasl.username"},
		{"tls ca file", strings.Replace(minimal, "postgres:", "  tls: {enabled: true, ca_file: /nope.pem}\npostgres:", 1), "kafka.tls.ca_file"},
		{"tls key without cert", strings.Replace(minimal, "postgres:", "  tls: {enabled: true, key_file: /etc/hostname}\npostgres:", 1), "kafka.tls.key_file"},
		{"tls flag", strings.Replace(minimal, "postgres:", "  tls: {enabled: maybe}\npostgres:", 1), "kafka.tls.enabled"},
		{"start offset key", strings.Replace(minimal, "postgres:", "  start_offset: middle\npostgres:", 1), "kafka.start_offset"},
		{"registry credentials in url", minimal + "schema_registry:\n  url: \"https://u:p@reg:8081\"\n", "schema_registry.url"},
		{"registry scheme", minimal + "schema_registry:\n  url: \"ftp://reg:8081\"\n", "schema_registry.url"},
		{"registry token and user", minimal + "schema_registry:\n  url: \"https://reg:8081\"\n  username: u\n  token_file: /etc/hostname\n", "schema_registry.token_file"},
		{"registry token missing", minimal + "schema_registry:\n  url: \"https://reg:8081\"\n  token_file: /nope\n", "schema_registry.token_file"},
		{"registry tls on http", minimal + "schema_registry:\n  url: \"http://reg:8081\"\n  tls: {ca_file: /etc/hostname}\n", "schema_registry.tls"},
		{"registry kind", minimal + "schema_registry:\n  kind: karapace\n", "schema_registry.kind"},
		{"apicurio use id", minimal + "schema_registry:\n  kind: apicurio\n  use_id: artifactId\n", "schema_registry.use_id"},
		{"use id for confluent", minimal + "schema_registry:\n  use_id: contentId\n", "schema_registry.use_id"},
		{"registry lookup", minimal + "schema_registry:\n  lookup_timeout: -1s\n", "schema_registry.lookup_timeout"},
		{"plain without tls", strings.Replace(minimal, "postgres:", "  sasl: {mechanism: PLAIN, username: u}\npostgres:", 1), "kafka.sasl.allow_plaintext"},
		{"scram without tls", strings.Replace(minimal, "postgres:", "  sasl: {mechanism: SCRAM-SHA-512, username: u}\npostgres:", 1), "kafka.sasl.allow_plaintext"},
		{"oauth without token", strings.Replace(minimal, "postgres:", "  sasl: {mechanism: OAUTHBEARER}\npostgres:", 1), "kafka.sasl.token_file"},
		{"oauth without tls", strings.Replace(minimal, "postgres:", "  sasl: {mechanism: OAUTHBEARER, token_file: /etc/hostname}\npostgres:", 1), "kafka.sasl.allow_plaintext"},
		{"registry password over http", minimal + "schema_registry:\n  url: \"http://reg:8081\"\n  username: u\n  password: p\n", "schema_registry.url"},
		{"registry token over HTTP", minimal + "schema_registry:\n  url: \"HTTP://reg:8081\"\n  token_file: /etc/hostname\n", "schema_registry.url"},
		{"msk iam without tls", strings.Replace(minimal, "postgres:", "  sasl: {mechanism: AWS_MSK_IAM}\npostgres:", 1), "kafka.tls.enabled"},
		{"password twice", strings.Replace(minimal, "postgres:", "  sasl: {mechanism: PLAIN, username: u, password: x, password_file: /etc/hostname}\npostgres:", 1), "kafka.sasl.password_file"},
		{"password file missing", strings.Replace(minimal, "postgres:", "  sasl: {mechanism: PLAIN, username: u, password_file: /nope}\npostgres:", 1), "kafka.sasl.password_file"},
		{"offset lost", strings.Replace(minimal, "postgres:", "  on_offset_lost: ignore\npostgres:", 1), "kafka.on_offset_lost"},
		{"pg schema", minimal + "postgres:\n  schema: \"a b\"\n", ""},
		{"pg schema value", strings.Replace(minimal, "postgres:\n", "postgres:\n  schema: \"a b\"\n", 1), "postgres.schema"},
		{"registry url", minimal + "schema_registry:\n  url: \"not a url\"\n", "schema_registry.url"},
		{"defaults format", minimal + "defaults:\n  format: csv\n", "defaults.format"},
		{"defaults connector", minimal + "defaults:\n  connector: db2\n", "defaults.connector"},
		{"defaults deletes", minimal + "defaults:\n  deletes: soft\n", "defaults.deletes"},
		{"ignored key", minimal + "    keys: [a]\n    ignore_columns: [a]\n", "tables[0].ignore_columns"},
		{"empty key name", minimal + "    keys: [\"\"]\n", "tables[0].keys"},
		{"no tables", strings.Split(minimal, "tables:")[0], "tables"},
		{"duplicate topic", minimal + "  - topic: shop.public.customers\n    target: other\n", "tables[1].topic"},
		{"duplicate target", minimal + "  - topic: x.y.customers\n", "tables[1].target"},
		{"bad target", minimal + "    target: \"a\\0b\"\n", "tables[0].target"},
		// 52 bytes: _scd_repairs would not fit PostgreSQL's 63.
		{"long target", minimal + "    target: \"" + strings.Repeat("ä", 26) + "\"\n", "tables[0].target"},
		{"format", minimal + "    format: protobuf\n", "tables[0].format"},
		{"avro without registry", minimal + "    format: debezium-avro\n", "schema_registry.url"},
		{"connector", minimal + "    connector: db2\n", "tables[0].connector"},
		{"empty sequence path", minimal + "    sequence_by: [\"\"]\n", "tables[0].sequence_by[0]"},
		{"scope", minimal + "    type1_scope: some\n", "tables[0].type1_scope"},
		{"deletes", minimal + "    deletes: purge\n", "tables[0].deletes"},
		{"partition by", minimal + "    partitioning: {by: scd_seq}\n", "tables[0].partitioning.by"},
		{"partition interval", minimal + "    partitioning: {interval: week}\n", "tables[0].partitioning.interval"},
		{"partition ahead", minimal + "    partitioning: {ahead: -1}\n", "tables[0].partitioning.ahead"},
		{"history constraint", minimal + "    history_constraint: unique\n", "tables[0].history_constraint"},
		{"no overlap partitioned", minimal + "    history_constraint: no_overlap\n    partitioning: {interval: month}\n", "tables[0].history_constraint"},
		{"defaults history constraint", minimal + "defaults:\n  history_constraint: strict\n", "defaults.history_constraint"},
		{"transaction topic name", minimal + "    transaction_topic: dbz transaction\n", "tables[0].transaction_topic"},
		{"defaults transaction topic", minimal + "defaults:\n  transaction_topic: a/b\n", "defaults.transaction_topic"},
		{"partition key", minimal + "    partitioning: {every: month}\n", "tables[0].partitioning.every"},
		{"retention unit", minimal + "    retention: 400 days\n", "tables[0].retention"},
		{"retention zero", minimal + "    retention: 0d\n", "tables[0].retention"},
		{"retention huge", minimal + "    retention: 9999999d\n", "tables[0].retention"},
		{"retention short", minimal + "    retention: 30m\n", "tables[0].retention"},
		{"retention in the window", minimal + "    retention: 2h\nsequencer: {reorder_window: 3h}\n", "tables[0].retention"},
		{"guard zero", minimal + "    snapshot_deletes_max_fraction: 0\n", "tables[0].snapshot_deletes_max_fraction"},
		{"guard above one", minimal + "    snapshot_deletes_max_fraction: 1.5\n", "tables[0].snapshot_deletes_max_fraction"},
		{"duplicate key", minimal + "    keys: [a, a]\n", "tables[0].keys"},
		{"tracked key", minimal + "    keys: [a]\n    track_history: [a]\n", "tables[0].track_history"},
		{"tracked and ignored", minimal + "    track_history: [b]\n    ignore_columns: [b]\n", "tables[0].track_history"},
		{"defaults scope", minimal + "defaults:\n  type1_scope: x\n", "defaults.type1_scope"},
		{"not yaml", "kafka: [", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), noEnv)
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want a *config.Error", err)
			}
			if tc.key != "" && ce.Key != tc.key {
				t.Fatalf("error names %q, want %q: %v", ce.Key, tc.key, err)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}

func TestUnknownKeyNamesLine(t *testing.T) {
	_, err := Parse([]byte(minimal+"    track_histroy: [a]\n"), noEnv)
	if err == nil || !strings.Contains(err.Error(), "track_histroy") || !strings.Contains(err.Error(), "line 8") {
		t.Fatalf("got %v", err)
	}
}

// Sizes are numbers of bytes or numbers with a unit, as DESIGN.md writes
// them (16MiB, 64MiB).
func TestSizes(t *testing.T) {
	for _, tc := range []struct {
		text string
		want ByteSize
	}{
		{"16MiB", 16 << 20}, {"64 MiB", 64 << 20}, {"1048576", 1 << 20}, {"2GiB", 2 << 30}, {"5MB", 5000000}, {"2048KiB", 2 << 20},
	} {
		t.Run(tc.text, func(t *testing.T) {
			c, err := Parse([]byte(minimal+"sink:\n  batch_max_bytes: "+tc.text+"\nsequencer:\n  max_buffered_bytes: "+tc.text+"\n"), noEnv)
			if err != nil {
				t.Fatal(err)
			}
			if c.Sink.BatchMaxBytes != tc.want || c.Sequencer.MaxBufferedBytes != tc.want {
				t.Errorf("%s read as %d and %d, want %d", tc.text, c.Sink.BatchMaxBytes, c.Sequencer.MaxBufferedBytes, tc.want)
			}
		})
	}
	for _, bad := range []string{"lots", "12XB", "-5MiB", "1KiB"} {
		t.Run(bad, func(t *testing.T) {
			_, err := Parse([]byte(minimal+"sink:\n  batch_max_bytes: "+bad+"\n"), noEnv)
			var ce *Error
			if !errors.As(err, &ce) || !strings.Contains(ce.Key, "batch_max_bytes") {
				t.Errorf("%q: %v, want an error naming sink.batch_max_bytes", bad, err)
			}
		})
	}
}

// TestSecretFiles: every secret has a *_file form (Kubernetes and Docker
// mount secrets as files); a trailing newline is not part of the secret,
// and the environment still wins.
func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	yaml := fmt.Sprintf(`
kafka:
  brokers: ["127.0.0.1:9092"]
  tls: {enabled: true}
  sasl: {mechanism: SCRAM-SHA-512, username: u, password_file: %q}
postgres:
  dsn_file: %q
schema_registry:
  url: "https://reg:8081"
  username: r
  password_file: %q
tables:
  - topic: shop.public.customers
`, write("kafka", "k-secret\n"), write("dsn", "postgres://u:pg-secret@db:5432/x\n"), write("reg", "r-secret"))
	c, err := Parse([]byte(yaml), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if c.Kafka.SASL.Password != "k-secret" || c.Postgres.DSN != "postgres://u:pg-secret@db:5432/x" || c.SchemaRegistry.Password != "r-secret" {
		t.Errorf("read %q %q %q", c.Kafka.SASL.Password, c.Postgres.DSN, c.SchemaRegistry.Password)
	}
	c, err = Parse([]byte(yaml), func(k string) (string, bool) { return "from-env", k == "SCD2SINK_KAFKA_SASL_PASSWORD" })
	if err != nil || c.Kafka.SASL.Password != "from-env" {
		t.Errorf("the environment does not win: %v %q", err, c.Kafka.SASL.Password)
	}
}

func TestRetentionPeriod(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{{"400d", 400 * 24 * time.Hour}, {"36h", 36 * time.Hour}, {"1h30m", 90 * time.Minute}} {
		t.Run(tc.in, func(t *testing.T) {
			c, err := Parse([]byte(minimal+"    retention: "+tc.in+"\n"), noEnv)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Tables[0].RetentionPeriod; got != tc.want {
				t.Errorf("retention %s: %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestPartitioningDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal+"    partitioning: {}\n"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Tables[0].Partitioning
	if p == nil || p.By != "valid_to" || p.Interval != "month" || *p.Ahead != 3 {
		t.Errorf("partitioning defaults: %+v", p)
	}
}

// TestPartitioningByValidFrom: DESIGN's example, by: valid_from, is
// accepted (run serves it as valid_to and warns).
func TestPartitioningByValidFrom(t *testing.T) {
	c, err := Parse([]byte(minimal+"    partitioning: {by: valid_from, interval: month}\n"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Tables[0].Partitioning; p == nil || p.By != "valid_from" || p.Interval != "month" {
		t.Errorf("partitioning: %+v", p)
	}
}
