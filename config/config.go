// Package config reads scd2sink's YAML configuration (DESIGN.md section 3):
// strict decoding (an unknown key is an error naming it and its line),
// defaults, the defaults: block, environment overrides and validation. Every
// error is an *Error naming the offending key; the command exits 2 on it.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole configuration file.
type Config struct {
	Kafka           Kafka          `yaml:"kafka"`
	Postgres        Postgres       `yaml:"postgres"`
	SchemaRegistry  SchemaRegistry `yaml:"schema_registry"`
	Sequencer       Sequencer      `yaml:"sequencer"`
	Sink            Sink           `yaml:"sink"`
	HTTP            HTTP           `yaml:"http"`
	Log             Log            `yaml:"log"`
	ShutdownTimeout time.Duration  `yaml:"shutdown_timeout"`
	Defaults        TableDefaults  `yaml:"defaults"`
	Tables          []Table        `yaml:"tables"`
	// ErasureKeyFile holds the secret that keys the hashes of erased keys
	// (DESIGN.md section 12); erase needs it, and so does run once a key
	// has been erased.
	ErasureKeyFile string `yaml:"erasure_key_file"`
	// ErasureKey is ErasureKeyFile's content, read by validation.
	ErasureKey []byte `yaml:"-"`
	// Rebuilding marks the configuration of a rebuild's tables: the
	// erasures recorded for a target apply to its rebuild table.
	Rebuilding bool `yaml:"-"`
}

// Kafka is the kafka: block.
type Kafka struct {
	Brokers     []string `yaml:"brokers"`
	GroupID     string   `yaml:"group_id"`
	ClientID    string   `yaml:"client_id"`
	StartOffset string   `yaml:"start_offset"`
	// SessionTimeout is the group session timeout (an addition to DESIGN.md:
	// how long a crashed member holds its partitions). Default 45s.
	SessionTimeout time.Duration `yaml:"session_timeout"`
	// MetadataMaxAge is how often the topic list is refreshed: a topic that
	// starts to match a topic_pattern is consumed within it (an addition
	// to DESIGN.md, Kafka's metadata.max.age.ms). Default 30s.
	MetadataMaxAge time.Duration `yaml:"metadata_max_age"`
	// IsolationLevel is read_committed (default: records of aborted Kafka
	// transactions are never read) or read_uncommitted.
	IsolationLevel string `yaml:"isolation_level"`
	// InstanceID turns on static group membership (KIP-345): a restarted
	// member with the same ID takes its partitions back at once instead
	// of waiting for its old session to expire. Default from
	// SCD2SINK_INSTANCE_ID (e.g. a StatefulSet's pod name); "" keeps
	// dynamic membership.
	InstanceID string `yaml:"instance_id"`
	// OnOffsetLost is what a stored offset that is no longer in the log
	// (retention passed it, the topic was deleted and re-created) does:
	// fail (default: exit 1 naming topic and partition), earliest or
	// latest. StartOffset only places a group that has no offsets.
	OnOffsetLost string `yaml:"on_offset_lost"`
	TLS          TLS    `yaml:"tls"`
	SASL         SASL   `yaml:"sasl"`
}

// TLS is kafka.tls.
type TLS struct {
	Enabled  bool   `yaml:"enabled"`
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// SASL is kafka.sasl.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or
	// AWS_MSK_IAM ("" for none).
	Mechanism string `yaml:"mechanism"`
	Username  string `yaml:"username"`
	Password  string `yaml:"password"`
	// PasswordFile holds the password (read at start).
	PasswordFile string `yaml:"password_file"`
	// TokenFile holds OAUTHBEARER's token; it is read again when it changes.
	TokenFile string `yaml:"token_file"`
	// AWSRegion is AWS_MSK_IAM's region; credentials come from the
	// standard AWS chain (environment, shared config, instance or pod role).
	AWSRegion string `yaml:"aws_region"`
	// AllowPlaintext lets PLAIN, SCRAM or OAUTHBEARER run without TLS, and
	// registry credentials go over http:// (refused otherwise).
	AllowPlaintext bool `yaml:"allow_plaintext"`
}

// Postgres is the postgres: block.
type Postgres struct {
	DSN string `yaml:"dsn"`
	// DSNFile holds the DSN (read at start).
	DSNFile string `yaml:"dsn_file"`
	Schema  string `yaml:"schema"`
	// LockTimeout bounds every statement's wait for a lock (default 5s):
	// the service backs off and retries rather than queue readers behind it.
	LockTimeout time.Duration `yaml:"lock_timeout"`
	// StatementTimeout cancels a statement running longer (default 5m);
	// the batch is retried.
	StatementTimeout time.Duration `yaml:"statement_timeout"`
}

// SchemaRegistry is the schema_registry: block (format debezium-avro only).
type SchemaRegistry struct {
	// Kind is confluent (the wire format and /schemas/ids/{id}; also
	// Apicurio's ccompat API) or apicurio (its v2/v3 API; ids from the
	// apicurio.*.globalId/contentId headers or the wire format).
	Kind string `yaml:"kind"`
	// UseID is, for kind apicurio, what the ids in the wire format are:
	// globalId (default, Apicurio 2.x converters) or contentId (3.x, and
	// apicurio.registry.as-confluent); it mirrors the converter's
	// apicurio.registry.use-id. Ids in headers name their kind themselves.
	UseID    string `yaml:"use_id"`
	URL      string `yaml:"url"`
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// PasswordFile holds the password (read at start).
	PasswordFile string `yaml:"password_file"`
	// TokenFile holds a bearer token, sent instead of basic auth; it is
	// read again when it changes.
	TokenFile string      `yaml:"token_file"`
	TLS       RegistryTLS `yaml:"tls"`
	// LookupTimeout is how long a schema id the registry does not know
	// yet (40403: a follower behind) is asked for again, its partition
	// waiting, before its records are dead letters (default 2m).
	LookupTimeout time.Duration `yaml:"lookup_timeout"`
}

// RegistryTLS is schema_registry.tls: a CA for an https URL, and a client
// certificate for mutual TLS.
type RegistryTLS struct {
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Sequencer is the sequencer: block.
type Sequencer struct {
	ReorderWindow     time.Duration `yaml:"reorder_window"`
	MaxBufferedEvents int           `yaml:"max_buffered_events"`
	// MaxBufferedBytes bounds the reorder buffer's memory; above it the
	// events due soonest are released before their window ends.
	MaxBufferedBytes ByteSize `yaml:"max_buffered_bytes"`
	// QuietAfter is how long no record must come, with a table's
	// partitions read to their end, before its events wait no longer
	// (nil: a quarter of the window, at most 500ms; 0: never).
	QuietAfter *time.Duration `yaml:"quiet_after"`
}

// Sink is the sink: block.
type Sink struct {
	BatchMaxEvents int `yaml:"batch_max_events"`
	// ApplyWorkers is how many transactions apply one batch side by side,
	// each for a disjoint set of partitions (default 2; 1 applies every
	// batch in one transaction).
	ApplyWorkers int `yaml:"apply_workers"`
	// BatchMaxBytes bounds the events waiting for or in the applier,
	// estimated in bytes (default 64 MiB): a batch is cut at a third of it.
	BatchMaxBytes   ByteSize      `yaml:"batch_max_bytes"`
	BatchMaxWait    time.Duration `yaml:"batch_max_wait"`
	DeadLetterTable string        `yaml:"dead_letter_table"`
}

// HTTP is the http: block.
type HTTP struct {
	Addr *string `yaml:"addr"` // nil: default; "": disabled
}

// Log is the log: block.
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// TableDefaults is the defaults: block; each table entry may override it.
type TableDefaults struct {
	Format     string `yaml:"format"`
	Connector  string `yaml:"connector"`
	ValidFrom  string `yaml:"valid_from"`
	Deletes    string `yaml:"deletes"`
	Type1Scope string `yaml:"type1_scope"`
	// HistoryConstraint is none (default) or no_overlap: PostgreSQL
	// enforces that no two versions of a key overlap.
	HistoryConstraint string `yaml:"history_constraint"`
	// TransactionTopic is Debezium's transaction metadata topic
	// (<topic.prefix>.transaction, written with
	// provide.transaction.metadata=true): with it, complete_through is
	// exact (DESIGN.md section 14). Empty: the heuristic of section 4.
	TransactionTopic string `yaml:"transaction_topic"`
}

// Table is one tables: entry.
type Table struct {
	Topic string `yaml:"topic"`
	// TopicPattern is a regular expression matched against whole topic
	// names, instead of Topic; Target is then a template ({table},
	// {schema}, {topic}; default "{table}_history"). See Router.
	TopicPattern  string   `yaml:"topic_pattern"`
	Target        string   `yaml:"target"`
	Keys          []string `yaml:"keys"`
	Format        string   `yaml:"format"`
	Connector     string   `yaml:"connector"`
	SequenceBy    []string `yaml:"sequence_by"`
	ValidFrom     string   `yaml:"valid_from"`
	TrackHistory  []string `yaml:"track_history"`
	IgnoreColumns []string `yaml:"ignore_columns"`
	Type1Scope    string   `yaml:"type1_scope"`
	Deletes       string   `yaml:"deletes"`
	// SnapshotDeletes is ignore (default) or close: a completed full
	// snapshot closes the keys it did not read.
	SnapshotDeletes string `yaml:"snapshot_deletes"`
	// SnapshotDeletesMaxFraction guards reconciliation: one that would
	// close more than this fraction of the table's live keys is held
	// until confirmed (default 0.5; 1 disables the guard).
	SnapshotDeletesMaxFraction *float64 `yaml:"snapshot_deletes_max_fraction"`
	// SchemaChanges is evolve (default) or fail: what a changed source
	// schema does to the history table (DESIGN.md section 11).
	SchemaChanges string `yaml:"schema_changes"`
	// HistoryConstraint is none or no_overlap (default: defaults').
	HistoryConstraint string `yaml:"history_constraint"`
	// TransactionTopic is the transaction metadata topic of the
	// connector writing this table's topic (default: defaults'; "none"
	// turns a default off for this entry).
	TransactionTopic string `yaml:"transaction_topic"`
	// Retention removes versions closed longer ago than it ("400d",
	// "36h"; empty keeps everything), DESIGN.md section 12.
	Retention string `yaml:"retention"`
	// RetentionPeriod is Retention parsed (0: none).
	RetentionPeriod time.Duration `yaml:"-"`
	// Partitioning creates the history table partitioned (DESIGN.md
	// section 12); nil: a plain table.
	Partitioning *Partitioning `yaml:"partitioning"`
	Views        []View        `yaml:"views"`
}

// Partitioning is a table's partitioning: block. The current versions live
// in one partition; closed versions in one partition per interval of
// their valid_to, so that a partition wholly before a retention horizon
// holds only versions retention removes.
type Partitioning struct {
	// By is the column closed versions are partitioned by: valid_to.
	By string `yaml:"by"`
	// Interval is day, month (default) or year.
	Interval string `yaml:"interval"`
	// Ahead is how many intervals after the current one are created in
	// advance (default 3).
	Ahead *int `yaml:"ahead"`
}

// ParsePeriod reads a retention period: a number of days ("400d") or a
// Go duration ("36h", "90m").
func ParsePeriod(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 32)
		if err != nil || n <= 0 || n > 100000 {
			return 0, fmt.Errorf("%q is not a number of days from 1 to 100000 (e.g. 400d)", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a period (400d, 36h)", s)
	}
	return d, nil
}

// View is one views: entry of a table: the history in another convention
// (DESIGN.md section 3).
type View struct {
	Name string `yaml:"name"`
	// Columns renames columns: source columns, scd_id, valid_from,
	// valid_to, is_current, scd_deleted.
	Columns map[string]string `yaml:"columns"`
	// Grain is timestamp (default) or day.
	Grain string `yaml:"grain"`
	// TimeZone is the IANA zone whose days grain day uses (default UTC).
	TimeZone string `yaml:"time_zone"`
	// End is exclusive (default) or inclusive.
	End string `yaml:"end"`
	// CurrentEnd replaces NULL in the end column of current versions.
	CurrentEnd string `yaml:"current_end"`
	// Deleted is show (default) or hide: whether the view shows the
	// versions marked deleted (deletes: new_record).
	Deleted string `yaml:"deleted"`
}

// ByteSize is a size in bytes, written as a number or with a unit: 64MiB,
// 512KiB, 1GiB, 16MB, 100kB.
type ByteSize int64

var sizePattern = regexp.MustCompile(`^\s*(\d+)\s*([KMGkmg]i?[Bb]|[Bb])?\s*$`)

// UnmarshalYAML reads a number of bytes or a size with a unit.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	m := sizePattern.FindStringSubmatch(n.Value)
	if n.Kind != yaml.ScalarNode || m == nil {
		return fmt.Errorf("line %d: %q is not a size (a number of bytes, or 64MiB, 512KiB, 1GiB, 16MB)", n.Line, n.Value)
	}
	v, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a size: %v", n.Line, n.Value, err)
	}
	unit := map[string]int64{"": 1, "b": 1, "kb": 1000, "kib": 1 << 10, "mb": 1000 * 1000, "mib": 1 << 20,
		"gb": 1000 * 1000 * 1000, "gib": 1 << 30}[strings.ToLower(m[2])]
	if v > (1<<62)/unit {
		return fmt.Errorf("line %d: %q is too large", n.Line, n.Value)
	}
	*b = ByteSize(v * unit)
	return nil
}

// Error is a configuration error: Key names the offending key (as a path
// like tables[1].type1_scope), Line its line in the file when known, Msg
// says why.
type Error struct {
	Key  string
	Line int
	Msg  string
}

// Error formats the error as "configuration: key (line N): why".
func (e *Error) Error() string {
	where := e.Key
	if e.Line > 0 {
		where = strings.TrimSpace(fmt.Sprintf("%s (line %d)", e.Key, e.Line))
	}
	if where == "" {
		return "configuration: " + e.Msg
	}
	return fmt.Sprintf("configuration: %s: %s", where, e.Msg)
}

func errf(key, format string, args ...any) *Error {
	return &Error{Key: key, Msg: fmt.Sprintf(format, args...)}
}

// Path resolves the configuration file: flag, then $SCD2SINK_CONFIG, then
// scd2sink.yaml in the working directory.
func Path(flag string) string {
	if flag != "" {
		return flag
	}
	if env := os.Getenv("SCD2SINK_CONFIG"); env != "" {
		return env
	}
	return "scd2sink.yaml"
}

// Load reads, completes and validates the configuration file at path.
func Load(path string) (*Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{Key: "", Msg: fmt.Sprintf("cannot read %s: %v", path, errors.Unwrap(err))}
	}
	return Parse(raw, os.LookupEnv)
}

// fileKeys is where the keys of a file are: the key path on each line
// that holds one, the value written on each line, and each key path's
// first line.
type fileKeys struct {
	keys   map[int]string
	values map[int][]lineValue
	lines  map[string]int
}

// lineValue is a scalar written on a line, and its key's path: a line
// may hold several (a flow mapping, a configuration written as JSON).
type lineValue struct{ path, value string }

// keyLines reads raw's keys (kafka.brokers, tables[1].deletes ...), to
// name keys and lines in errors.
func keyLines(raw []byte) fileKeys {
	fk := fileKeys{keys: map[int]string{}, values: map[int][]lineValue{}, lines: map[string]int{}}
	var root yaml.Node
	if yaml.Unmarshal(raw, &root) != nil {
		return fk
	}
	note := func(line int, path string) {
		fk.keys[line] = path
		if _, ok := fk.lines[path]; !ok {
			fk.lines[path] = line
		}
	}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if path != "" {
					p = path + "." + p
				}
				note(n.Content[i].Line, p)
				v := n.Content[i+1]
				fk.keys[v.Line] = p
				if v.Kind == yaml.ScalarNode {
					fk.values[v.Line] = append(fk.values[v.Line], lineValue{path: p, value: v.Value})
				}
				walk(v, p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := fmt.Sprintf("%s[%d]", path, i)
				if _, taken := fk.keys[c.Line]; !taken || c.Kind != yaml.MappingNode {
					fk.keys[c.Line] = p
				}
				if _, ok := fk.lines[p]; !ok {
					fk.lines[p] = c.Line
				}
				walk(c, p)
			}
		}
	}
	walk(&root, "")
	return fk
}

// Parse decodes raw YAML, applies env (os.LookupEnv in production) and the
// defaults, and validates the result.
func Parse(raw []byte, env func(string) (string, bool)) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	fk := keyLines(raw)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlErrors(err, fk.keys, fk.values)
	}
	if err := c.readSecretFiles(); err != nil {
		return nil, withLines(err, fk.lines)
	}
	if err := c.applyEnv(env); err != nil {
		return nil, err
	}
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return nil, withLines(err, fk.lines)
	}
	return &c, nil
}

// readSecretFiles reads the *_file forms of secrets (Kubernetes and Docker
// mount secrets as files). A secret given both inline and as a file is an
// error; the environment still wins over both.
func (c *Config) readSecretFiles() error {
	for _, f := range []struct {
		key, fileKey string
		value, file  *string
	}{
		{"postgres.dsn", "postgres.dsn_file", &c.Postgres.DSN, &c.Postgres.DSNFile},
		{"kafka.sasl.password", "kafka.sasl.password_file", &c.Kafka.SASL.Password, &c.Kafka.SASL.PasswordFile},
		{"schema_registry.password", "schema_registry.password_file", &c.SchemaRegistry.Password, &c.SchemaRegistry.PasswordFile},
	} {
		if *f.file == "" {
			continue
		}
		if *f.value != "" {
			return &Error{Key: f.fileKey, Msg: "is set together with " + f.key + "; give the secret once"}
		}
		raw, err := os.ReadFile(*f.file)
		if err != nil {
			return &Error{Key: f.fileKey, Msg: "cannot be read: " + err.Error()}
		}
		*f.value = strings.TrimRight(string(raw), "\r\n")
		if *f.value == "" {
			return &Error{Key: f.fileKey, Msg: *f.file + " is empty"}
		}
	}
	return nil
}

func (c *Config) applyEnv(env func(string) (string, bool)) error {
	if v, ok := env("SCD2SINK_KAFKA_BROKERS"); ok {
		c.Kafka.Brokers = nil
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				c.Kafka.Brokers = append(c.Kafka.Brokers, b)
			}
		}
	}
	set := func(name string, dst *string) {
		if v, ok := env(name); ok {
			*dst = v
		}
	}
	set("SCD2SINK_POSTGRES_DSN", &c.Postgres.DSN)
	set("SCD2SINK_KAFKA_SASL_PASSWORD", &c.Kafka.SASL.Password)
	set("SCD2SINK_SCHEMA_REGISTRY_PASSWORD", &c.SchemaRegistry.Password)
	set("SCD2SINK_LOG_LEVEL", &c.Log.Level)
	if v, ok := env("SCD2SINK_INSTANCE_ID"); ok && c.Kafka.InstanceID == "" {
		c.Kafka.InstanceID = v
	}
	if v, ok := env("SCD2SINK_HTTP_ADDR"); ok {
		c.HTTP.Addr = &v
	}
	return nil
}
