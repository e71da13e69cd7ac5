package config

import (
	"strings"
	"time"
)

// DefaultHTTPAddr is where /metrics, /healthz and /readyz are served by default.
const DefaultHTTPAddr = "127.0.0.1:9464"

// DefaultSnapshotDeletesMaxFraction is snapshot_deletes_max_fraction's
// default: a reconciliation closing more than half the live keys is held.
const DefaultSnapshotDeletesMaxFraction = 0.5

func (c *Config) applyDefaults() {
	or := func(dst *string, def string) {
		if *dst == "" {
			*dst = def
		}
	}
	or(&c.Kafka.GroupID, "scd2sink")
	or(&c.Kafka.ClientID, "scd2sink")
	or(&c.Kafka.StartOffset, "earliest")
	or(&c.Kafka.IsolationLevel, "read_committed")
	or(&c.Kafka.OnOffsetLost, "fail")
	or(&c.SchemaRegistry.Kind, "confluent")
	if c.SchemaRegistry.Kind == "apicurio" {
		or(&c.SchemaRegistry.UseID, "globalId")
	}
	if c.SchemaRegistry.LookupTimeout == 0 {
		c.SchemaRegistry.LookupTimeout = 2 * time.Minute
	}
	if c.Kafka.MetadataMaxAge == 0 {
		c.Kafka.MetadataMaxAge = 30 * time.Second
	}
	if c.Kafka.SessionTimeout == 0 {
		c.Kafka.SessionTimeout = 45 * time.Second
	}
	or(&c.Postgres.Schema, "public")
	if c.Postgres.LockTimeout == 0 {
		c.Postgres.LockTimeout = 5 * time.Second
	}
	if c.Postgres.StatementTimeout == 0 {
		c.Postgres.StatementTimeout = 5 * time.Minute
	}
	if c.Sequencer.ReorderWindow == 0 {
		c.Sequencer.ReorderWindow = 2 * time.Second
	}
	if c.Sequencer.MaxBufferedEvents == 0 {
		c.Sequencer.MaxBufferedEvents = 200000
	}
	if c.Sequencer.MaxBufferedBytes == 0 {
		c.Sequencer.MaxBufferedBytes = 16 << 20
	}
	if c.Sink.ApplyWorkers == 0 {
		c.Sink.ApplyWorkers = 2
	}
	if c.Sink.BatchMaxEvents == 0 {
		c.Sink.BatchMaxEvents = 10000
	}
	if c.Sink.BatchMaxBytes == 0 {
		c.Sink.BatchMaxBytes = 64 << 20
	}
	if c.Sink.BatchMaxWait == 0 {
		c.Sink.BatchMaxWait = 250 * time.Millisecond
	}
	or(&c.Sink.DeadLetterTable, "scd2sink_dead_letters")
	if c.HTTP.Addr == nil {
		addr := DefaultHTTPAddr
		c.HTTP.Addr = &addr
	}
	or(&c.Log.Level, "info")
	or(&c.Log.Format, "json")
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	d := &c.Defaults
	or(&d.Format, "debezium-json")
	or(&d.Connector, "postgresql")
	or(&d.ValidFrom, "source.ts_ms")
	or(&d.Deletes, "close")
	or(&d.Type1Scope, "all_versions")
	or(&d.HistoryConstraint, "none")
	for i := range c.Tables {
		t := &c.Tables[i]
		or(&t.Format, d.Format)
		or(&t.Connector, d.Connector)
		or(&t.ValidFrom, d.ValidFrom)
		or(&t.Deletes, d.Deletes)
		or(&t.Type1Scope, d.Type1Scope)
		or(&t.HistoryConstraint, d.HistoryConstraint)
		or(&t.TransactionTopic, d.TransactionTopic)
		if t.TransactionTopic == "none" {
			t.TransactionTopic = ""
		}
		if t.Target == "" && t.Topic != "" {
			parts := strings.Split(t.Topic, ".")
			t.Target = parts[len(parts)-1] + "_history"
		}
		if t.Target == "" && t.TopicPattern != "" {
			t.Target = "{table}_history"
		}
		if len(t.SequenceBy) == 0 {
			t.SequenceBy = DefaultSequenceBy[t.Connector]
		}
	}
}

// Connectors are the values connector: takes: the Debezium source
// connectors whose envelopes scd2sink knows (docs/sources.md).
var Connectors = []string{"postgresql", "mysql", "mariadb", "sqlserver", "oracle", "mongodb"}

// DefaultSequenceBy is the sequence_by of each connector when a table does not set it.
var DefaultSequenceBy = map[string][]string{
	"postgresql": {"source.lsn"},
	"mysql":      {"source.file", "source.pos", "source.row"},
	// MariaDB: the GTID's number within its domain first, which a promoted
	// replica continues while its binlog positions start again (the
	// file, position and row order the events of one transaction).
	"mariadb":   {"source.gtid", "source.file", "source.pos", "source.row"},
	"sqlserver": {"source.commit_lsn", "source.change_lsn", "source.event_serial_no"},
	// Oracle (LogMiner): the commit's SCN orders transactions; the
	// change's SCN, its redo record (rs_id, fixed-width hex) and SQL
	// sequence number order a transaction's changes. SCNs are decimal
	// strings of any length, compared as numbers.
	"oracle": {"source.commit_scn", "source.scn", "source.rs_id", "source.ssn"},
	// MongoDB: the oplog entry's cluster time (seconds) and its order
	// within the second.
	"mongodb": {"source.ts_ms", "source.ord"},
}

// HTTPAddr returns the HTTP listen address; empty means disabled.
func (c *Config) HTTPAddr() string {
	if c.HTTP.Addr == nil {
		return DefaultHTTPAddr
	}
	return *c.HTTP.Addr
}
