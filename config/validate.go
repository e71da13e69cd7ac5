package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// MaxTargetBytes is the longest target whose derived names fit
// PostgreSQL's 63 bytes without truncation (DESIGN.md section 4): the
// longest suffix is _scd_repairs (12 bytes). Index names have suffixes of
// at most 12 bytes too; rebuild names its tables by a digest of targets
// too long for <target>__rebuild.
const MaxTargetBytes = 63 - len("_scd_repairs")

// maxNameBytes is PostgreSQL's limit on an identifier (NAMEDATALEN - 1).
const maxNameBytes = 63

// validName checks a name the service quotes as an identifier: any text
// (quotes, spaces, mixed case, non-ASCII) of 1 to max bytes of UTF-8
// without NUL; PostgreSQL would silently truncate a longer one.
func validName(key, name string, max int, why string) error {
	switch {
	case name == "":
		return errf(key, "is empty")
	case !utf8.ValidString(name) || strings.ContainsRune(name, 0):
		return errf(key, "%q is not valid UTF-8 text without NUL", name)
	case len(name) > max:
		return errf(key, "%q is %d bytes; at most %d fit%s", name, len(name), max, why)
	}
	return nil
}

func oneOf(key, value string, allowed ...string) error {
	if slices.Contains(allowed, value) {
		return nil
	}
	return errf(key, "%q is not one of %v", value, allowed)
}

// Validate checks every value and returns what is wrong, naming the keys:
// the first mistake of each block (kafka, the services, each tables
// entry), all at once (Errors), or nil.
func (c *Config) Validate() error {
	var out Errors
	for _, check := range []func() error{c.validateKafka, c.validateServices, c.validateTables} {
		out = appendErr(out, check())
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// appendErr adds err's mistakes to es.
func appendErr(es Errors, err error) Errors {
	var many Errors
	var one *Error
	switch {
	case err == nil:
	case errors.As(err, &many):
		es = append(es, many...)
	case errors.As(err, &one):
		es = append(es, one)
	default:
		es = append(es, &Error{Msg: err.Error()})
	}
	return es
}

// instanceID is what Kafka accepts as a group.instance.id.
var instanceID = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func (c *Config) validateKafka() error {
	if err := oneOf("kafka.isolation_level", c.Kafka.IsolationLevel, "read_committed", "read_uncommitted"); err != nil {
		return err
	}
	k := c.Kafka
	if len(k.Brokers) == 0 {
		return errf("kafka.brokers", "at least one broker is required (or set SCD2SINK_KAFKA_BROKERS)")
	}
	for i, b := range k.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return errf(fmt.Sprintf("kafka.brokers[%d]", i), "%q is not host:port", b)
		}
	}
	if err := oneOf("kafka.start_offset", k.StartOffset, "earliest", "latest"); err != nil {
		return err
	}
	if err := oneOf("kafka.on_offset_lost", k.OnOffsetLost, "fail", "earliest", "latest"); err != nil {
		return err
	}
	if k.InstanceID != "" && !instanceID.MatchString(k.InstanceID) {
		return errf("kafka.instance_id", "%q must be 1 to 249 of the characters a-z A-Z 0-9 . _ - (as Kafka's group.instance.id)", k.InstanceID)
	}
	if k.MetadataMaxAge < 100*time.Millisecond {
		return errf("kafka.metadata_max_age", "must be at least 100ms")
	}
	if k.SessionTimeout < time.Second {
		return errf("kafka.session_timeout", "must be at least 1s")
	}
	if k.TLS.Enabled {
		for key, f := range map[string]string{"kafka.tls.ca_file": k.TLS.CAFile, "kafka.tls.cert_file": k.TLS.CertFile, "kafka.tls.key_file": k.TLS.KeyFile} {
			if f == "" {
				continue
			}
			if _, err := os.Stat(f); err != nil {
				return errf(key, "cannot read %s", f)
			}
		}
		if (k.TLS.CertFile == "") != (k.TLS.KeyFile == "") {
			return errf("kafka.tls.key_file", "cert_file and key_file go together")
		}
	}
	if err := oneOf("kafka.sasl.mechanism", k.SASL.Mechanism, "", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "AWS_MSK_IAM"); err != nil {
		return err
	}
	switch k.SASL.Mechanism {
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if k.SASL.Username == "" {
			return errf("kafka.sasl.username", "is required with mechanism %s", k.SASL.Mechanism)
		}
		if !k.TLS.Enabled && !k.SASL.AllowPlaintext {
			return errf("kafka.sasl.allow_plaintext", "%s without TLS sends the password in clear: enable kafka.tls, or set allow_plaintext: true", k.SASL.Mechanism)
		}
	case "OAUTHBEARER":
		if k.SASL.TokenFile == "" {
			return errf("kafka.sasl.token_file", "is required with mechanism OAUTHBEARER (a file holding the token)")
		}
		if _, err := os.Stat(k.SASL.TokenFile); err != nil {
			return errf("kafka.sasl.token_file", "cannot read %s", k.SASL.TokenFile)
		}
		if !k.TLS.Enabled && !k.SASL.AllowPlaintext {
			return errf("kafka.sasl.allow_plaintext", "OAUTHBEARER without TLS sends the token in clear: enable kafka.tls, or set allow_plaintext: true")
		}
	case "AWS_MSK_IAM":
		if !k.TLS.Enabled {
			return errf("kafka.tls.enabled", "AWS_MSK_IAM needs TLS (MSK's IAM listener is TLS only)")
		}
	}
	return nil
}

// validateRegistry checks the schema_registry block.
func (c *Config) validateRegistry() error {
	r := c.SchemaRegistry
	if err := oneOf("schema_registry.kind", r.Kind, "confluent", "apicurio"); err != nil {
		return err
	}
	switch {
	case r.Kind == "apicurio":
		if err := oneOf("schema_registry.use_id", r.UseID, "globalId", "contentId"); err != nil {
			return err
		}
	case r.UseID != "":
		return errf("schema_registry.use_id", "is for kind apicurio only (a Confluent registry has one kind of id)")
	}
	if r.URL != "" {
		u, err := url.Parse(r.URL)
		if err != nil || u.Host == "" {
			return errf("schema_registry.url", "is not a URL")
		}
		if u.User != nil {
			return errf("schema_registry.url", "holds credentials: give them as username and password (or password_file, SCD2SINK_SCHEMA_REGISTRY_PASSWORD) or token_file, never in the URL")
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return errf("schema_registry.url", "must be http or https")
		}
		if u.Scheme != "https" && (r.TLS.CAFile != "" || r.TLS.CertFile != "") {
			return errf("schema_registry.tls", "is set but the URL is not https")
		}
		if u.Scheme != "https" && (r.Username != "" || r.Password != "" || r.TokenFile != "") && !c.Kafka.SASL.AllowPlaintext {
			return errf("schema_registry.url", "is http:// but registry credentials are set: they would travel in clear; use https://, or set kafka.sasl.allow_plaintext: true")
		}
	}
	if r.TokenFile != "" {
		if r.Username != "" {
			return errf("schema_registry.token_file", "and username are both set: use one")
		}
		if _, err := os.Stat(r.TokenFile); err != nil {
			return errf("schema_registry.token_file", "cannot read %s", r.TokenFile)
		}
	}
	for key, f := range map[string]string{"schema_registry.tls.ca_file": r.TLS.CAFile, "schema_registry.tls.cert_file": r.TLS.CertFile, "schema_registry.tls.key_file": r.TLS.KeyFile} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return errf(key, "cannot read %s", f)
		}
	}
	if (r.TLS.CertFile == "") != (r.TLS.KeyFile == "") {
		return errf("schema_registry.tls.key_file", "cert_file and key_file go together")
	}
	if r.LookupTimeout < 0 {
		return errf("schema_registry.lookup_timeout", "must not be negative")
	}
	return nil
}

func (c *Config) validateServices() error {
	if c.Postgres.DSN == "" {
		return errf("postgres.dsn", "is required (or set SCD2SINK_POSTGRES_DSN)")
	}
	if _, err := pgconn.ParseConfig(c.Postgres.DSN); err != nil {
		// pgconn's message can quote the DSN with its password: say less.
		return errf("postgres.dsn", "is not a valid PostgreSQL connection string")
	}
	if !identifier.MatchString(c.Postgres.Schema) {
		return errf("postgres.schema", "%q is not a plain identifier", c.Postgres.Schema)
	}
	if c.Postgres.LockTimeout < time.Millisecond {
		return errf("postgres.lock_timeout", "must be at least 1ms")
	}
	if c.Postgres.StatementTimeout < time.Millisecond {
		return errf("postgres.statement_timeout", "must be at least 1ms")
	}
	if err := c.validateRegistry(); err != nil {
		return err
	}
	if c.Sequencer.ReorderWindow < 0 {
		return errf("sequencer.reorder_window", "must not be negative")
	}
	if q := c.Sequencer.QuietAfter; q != nil && *q < 0 {
		return errf("sequencer.quiet_after", "must not be negative (0 turns it off)")
	}
	if c.Sequencer.MaxBufferedEvents < 1 {
		return errf("sequencer.max_buffered_events", "must be at least 1")
	}
	if c.Sequencer.MaxBufferedBytes < 1<<20 {
		return errf("sequencer.max_buffered_bytes", "must be at least 1048576 (1 MiB)")
	}
	if c.Sink.ApplyWorkers < 1 || c.Sink.ApplyWorkers > 64 {
		return errf("sink.apply_workers", "must be between 1 and 64")
	}
	if c.Sink.BatchMaxEvents < 1 {
		return errf("sink.batch_max_events", "must be at least 1")
	}
	if c.Sink.BatchMaxBytes < 1<<20 {
		return errf("sink.batch_max_bytes", "must be at least 1048576 (1 MiB)")
	}
	if c.Sink.BatchMaxWait <= 0 {
		return errf("sink.batch_max_wait", "must be positive")
	}
	if !identifier.MatchString(c.Sink.DeadLetterTable) {
		return errf("sink.dead_letter_table", "%q is not a plain identifier", c.Sink.DeadLetterTable)
	}
	if len(c.Sink.DeadLetterTable) > maxNameBytes-len("__rebuild") {
		return errf("sink.dead_letter_table", "%q is %d bytes; at most %d fit with rebuild's suffix __rebuild",
			c.Sink.DeadLetterTable, len(c.Sink.DeadLetterTable), maxNameBytes-len("__rebuild"))
	}
	if addr := c.HTTPAddr(); addr != "" {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return errf("http.addr", "%q is not host:port", addr)
		}
	}
	if err := oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error"); err != nil {
		return err
	}
	if err := oneOf("log.format", c.Log.Format, "json", "console"); err != nil {
		return err
	}
	if c.ShutdownTimeout <= 0 {
		return errf("shutdown_timeout", "must be positive")
	}
	if c.ErasureKeyFile != "" {
		raw, err := os.ReadFile(c.ErasureKeyFile)
		if err != nil {
			return errf("erasure_key_file", "%v", err)
		}
		key := bytes.TrimRight(raw, "\r\n")
		if len(key) < 16 {
			return errf("erasure_key_file", "%s holds %d bytes; the secret must be at least 16 (e.g. openssl rand -hex 32)", c.ErasureKeyFile, len(key))
		}
		c.ErasureKey = key
	}
	d := c.Defaults
	for _, chk := range []error{
		oneOf("defaults.format", d.Format, "debezium-json", "debezium-avro"),
		oneOf("defaults.connector", d.Connector, Connectors...),
		oneOf("defaults.deletes", d.Deletes, "close", "ignore", "new_record"),
		oneOf("defaults.type1_scope", d.Type1Scope, "all_versions", "current_version"),
		oneOf("defaults.history_constraint", d.HistoryConstraint, "none", "no_overlap"),
		transactionTopic("defaults.transaction_topic", d.TransactionTopic, ""),
	} {
		if chk != nil {
			return chk
		}
	}
	return nil
}

func (c *Config) validateTables() error {
	if len(c.Tables) == 0 {
		return errf("tables", "at least one table is required")
	}
	topics, targets := map[string]int{}, map[string]int{}
	views := map[string]string{}
	var out Errors
	for i, t := range c.Tables {
		out = appendErr(out, c.validateTable(i, t, topics, targets, views))
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// validateTable checks tables entry i; topics and targets are those of
// the entries before it.
func (c *Config) validateTable(i int, t Table, topics, targets map[string]int, views map[string]string) error {
	key := func(field string) string { return fmt.Sprintf("tables[%d].%s", i, field) }
	if t.TopicPattern != "" {
		if t.Topic != "" {
			return errf(key("topic_pattern"), "and topic are both set: use one")
		}
		if err := validatePattern(key, t); err != nil {
			return err
		}
		return c.validateTableSettings(i, key, t, views)
	}
	if t.Topic == "" {
		return errf(key("topic"), "is required (or topic_pattern)")
	}
	if j, dup := topics[t.Topic]; dup {
		return errf(key("topic"), "%q is also tables[%d].topic", t.Topic, j)
	}
	topics[t.Topic] = i
	if err := validName(key("target"), t.Target, MaxTargetBytes,
		" (PostgreSQL's 63 bytes less the longest derived suffix, _scd_repairs; set a shorter target)"); err != nil {
		return err
	}
	if j, dup := targets[t.Target]; dup {
		return errf(key("target"), "%q is also tables[%d].target", t.Target, j)
	}
	targets[t.Target] = i
	return c.validateTableSettings(i, key, t, views)
}

// validateTableSettings checks the settings of a tables entry that do not
// depend on how it names its topics.
func (c *Config) validateTableSettings(i int, key func(string) string, t Table, views map[string]string) error {
	{
		if err := oneOf(key("format"), t.Format, "debezium-json", "debezium-avro"); err != nil {
			return err
		}
		if t.Format == "debezium-avro" {
			if c.SchemaRegistry.URL == "" {
				return errf("schema_registry.url", "is required by %s (format debezium-avro)", key("format"))
			}
		}
		if err := oneOf(key("connector"), t.Connector, Connectors...); err != nil {
			return err
		}
		if len(t.SequenceBy) == 0 {
			return errf(key("sequence_by"), "must name at least one envelope path")
		}
		for j, p := range t.SequenceBy {
			if p == "" {
				return errf(fmt.Sprintf("tables[%d].sequence_by[%d]", i, j), "is empty")
			}
		}
		if t.ValidFrom == "" {
			return errf(key("valid_from"), "is empty")
		}
		if err := oneOf(key("type1_scope"), t.Type1Scope, "all_versions", "current_version"); err != nil {
			return err
		}
		if err := oneOf(key("history_constraint"), t.HistoryConstraint, "none", "no_overlap"); err != nil {
			return err
		}
		if err := transactionTopic(key("transaction_topic"), t.TransactionTopic, t.Topic); err != nil {
			return err
		}
		if t.HistoryConstraint == "no_overlap" && t.Partitioning != nil {
			return errf(key("history_constraint"), "no_overlap cannot be enforced on a partitioned table (PostgreSQL's exclusion constraints do not span partitions): drop one of history_constraint and partitioning")
		}
		if err := oneOf(key("deletes"), t.Deletes, "close", "ignore", "new_record"); err != nil {
			return err
		}
		if t.SnapshotDeletes == "" {
			c.Tables[i].SnapshotDeletes = "ignore"
		} else if err := oneOf(key("snapshot_deletes"), t.SnapshotDeletes, "ignore", "close"); err != nil {
			return err
		}
		if t.Retention != "" {
			d, err := ParsePeriod(t.Retention)
			if err != nil {
				return errf(key("retention"), "%v", err)
			}
			if d < time.Hour || d <= c.Sequencer.ReorderWindow {
				return errf(key("retention"), "%s is shorter than an hour or than sequencer.reorder_window: versions a late event still needs would go", t.Retention)
			}
			c.Tables[i].RetentionPeriod = d
		}
		if p := t.Partitioning; p != nil {
			if p.By == "" {
				p.By = "valid_to"
			}
			// valid_from is accepted and served as valid_to (run warns):
			// current versions live in a partition of their own, closed
			// ones in that of their end, so a partition before a
			// retention horizon holds nothing that is kept.
			if p.By != "valid_to" && p.By != "valid_from" {
				return errf(key("partitioning.by"), "%q: valid_to (a closed version's partition is that of its end, so a partition before a retention horizon holds nothing that is kept; current versions live in a partition of their own)", p.By)
			}
			if p.Interval == "" {
				p.Interval = "month"
			}
			if err := oneOf(key("partitioning.interval"), p.Interval, "day", "month", "year"); err != nil {
				return err
			}
			if p.Ahead == nil {
				three := 3
				p.Ahead = &three
			}
			if *p.Ahead < 0 || *p.Ahead > 366 {
				return errf(key("partitioning.ahead"), "%d is not from 0 to 366", *p.Ahead)
			}
		}
		if t.SchemaChanges == "" {
			c.Tables[i].SchemaChanges = "evolve"
		} else if err := oneOf(key("schema_changes"), t.SchemaChanges, "evolve", "fail"); err != nil {
			return err
		}
		if f := t.SnapshotDeletesMaxFraction; f == nil {
			half := DefaultSnapshotDeletesMaxFraction
			c.Tables[i].SnapshotDeletesMaxFraction = &half
		} else if !(*f > 0 && *f <= 1) {
			return errf(key("snapshot_deletes_max_fraction"), "is %v: a fraction of the live keys above 0 and at most 1 (1 disables the guard)", *f)
		}
		if err := distinct(key("keys"), t.Keys); err != nil {
			return err
		}
		if t.Connector == "mongodb" && len(t.Keys) > 0 && !slices.Equal(t.Keys, []string{"_id"}) {
			return errf(key("keys"), "is %v: a MongoDB topic's key is its documents' _id (leave keys out)", t.Keys)
		}
		for _, col := range t.TrackHistory {
			if slices.Contains(t.Keys, col) {
				return errf(key("track_history"), "%q is a key column", col)
			}
			if slices.Contains(t.IgnoreColumns, col) {
				return errf(key("track_history"), "%q is also in ignore_columns", col)
			}
		}
		for _, col := range t.IgnoreColumns {
			if slices.Contains(t.Keys, col) {
				return errf(key("ignore_columns"), "%q is a key column", col)
			}
		}
		for j := range t.Views {
			if err := validateView(fmt.Sprintf("tables[%d].views[%d]", i, j), &c.Tables[i].Views[j], views); err != nil {
				return err
			}
		}
	}
	return nil
}

func distinct(key string, list []string) error {
	seen := map[string]bool{}
	for _, s := range list {
		if s == "" {
			return errf(key, "contains an empty name")
		}
		if seen[s] {
			return errf(key, "%q appears twice", s)
		}
		seen[s] = true
	}
	return nil
}

// validateView checks a views: entry and fills its defaults; seen maps the
// view names met so far to their keys.
func validateView(key string, v *View, seen map[string]string) error {
	if err := validName(key+".name", v.Name, maxNameBytes, " in a PostgreSQL name"); err != nil {
		return err
	}
	if other, dup := seen[v.Name]; dup {
		return errf(key+".name", "%q is also %s.name", v.Name, other)
	}
	seen[v.Name] = key
	if v.Grain == "" {
		v.Grain = "timestamp"
	}
	if v.End == "" {
		v.End = "exclusive"
	}
	if v.TimeZone == "" {
		v.TimeZone = "UTC"
	}
	if err := oneOf(key+".grain", v.Grain, "timestamp", "day"); err != nil {
		return err
	}
	if err := oneOf(key+".end", v.End, "exclusive", "inclusive"); err != nil {
		return err
	}
	if v.Deleted == "" {
		v.Deleted = "show"
	}
	if err := oneOf(key+".deleted", v.Deleted, "show", "hide"); err != nil {
		return err
	}
	if _, err := time.LoadLocation(v.TimeZone); err != nil {
		return errf(key+".time_zone", "%q is not an IANA time zone", v.TimeZone)
	}
	if v.CurrentEnd != "" {
		layouts := []string{"2006-01-02", time.RFC3339Nano, "2006-01-02 15:04:05"}
		ok := false
		for _, l := range layouts {
			if _, err := time.Parse(l, v.CurrentEnd); err == nil {
				ok = true
			}
		}
		if !ok {
			return errf(key+".current_end", "%q is not a date or timestamp (2006-01-02 or RFC 3339)", v.CurrentEnd)
		}
	}
	names := map[string]string{}
	for from, to := range v.Columns {
		if from == "" {
			return errf(key+".columns", "a column to rename is empty")
		}
		if err := validName(key+".columns", to, maxNameBytes, " in a PostgreSQL name"); err != nil {
			return err
		}
		if other, dup := names[to]; dup {
			return errf(key+".columns", "%q and %q are both renamed to %q", other, from, to)
		}
		names[to] = from
	}
	return nil
}

// validatePattern checks a topic_pattern entry: the expression compiles,
// and its target template names only {table}, {schema} and {topic}.
// Views name one relation each: they need an exact topic.
func validatePattern(key func(string) string, t Table) error {
	if _, err := regexp.Compile(anchored(t.TopicPattern)); err != nil {
		return errf(key("topic_pattern"), "is not a regular expression: %v", err)
	}
	rest := templateVar.ReplaceAllString(t.Target, "")
	if strings.ContainsAny(rest, "{}") {
		return errf(key("target"), "%q: a template may name only {table}, {schema} and {topic}", t.Target)
	}
	if !strings.Contains(t.Target, "{") {
		return errf(key("target"), "%q names no {table}, {schema} or {topic}: every matched topic would write to one table", t.Target)
	}
	if len(t.Views) > 0 {
		return errf(key("views"), "need an exact topic: a topic_pattern entry has many targets")
	}
	return nil
}

// kafkaTopic is what Kafka accepts as a topic name.
var kafkaTopic = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// transactionTopic checks a transaction_topic: empty or none (not
// tracked), else a Kafka topic name other than the table's own topic.
func transactionTopic(key, v, topic string) error {
	switch {
	case v == "" || v == "none":
		return nil
	case !kafkaTopic.MatchString(v):
		return errf(key, "%q is not a Kafka topic name (letters, digits, '.', '_' and '-')", v)
	case v == topic:
		return errf(key, "names the table's own topic; it is Debezium's transaction metadata topic, <topic.prefix>.transaction")
	}
	return nil
}
