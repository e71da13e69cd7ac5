package scdtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// The source blocks of Debezium 3.6.1's SQL Server, Oracle (LogMiner) and
// MongoDB connectors, field for field as their SourceInfoStructMakers
// build them: the common fields, then the connector's own.
const commonSourceFields = `{"type":"string","optional":false,"field":"version"},{"type":"string","optional":false,"field":"connector"},{"type":"string","optional":false,"field":"name"},{"type":"int64","optional":false,"field":"ts_ms"},{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},"default":"false","field":"snapshot"},{"type":"string","optional":false,"field":"db"},{"type":"string","optional":true,"field":"sequence"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"}`

var connectorSources = map[string]struct{ schemaName, fields string }{
	"sqlserver": {"io.debezium.connector.sqlserver.Source",
		`{"type":"string","optional":false,"field":"schema"},{"type":"string","optional":false,"field":"table"},{"type":"string","optional":true,"field":"change_lsn"},{"type":"string","optional":true,"field":"commit_lsn"},{"type":"int64","optional":true,"field":"event_serial_no"}`},
	"oracle": {"io.debezium.connector.oracle.Source",
		`{"type":"string","optional":false,"field":"schema"},{"type":"string","optional":false,"field":"table"},{"type":"string","optional":true,"field":"txId"},{"type":"string","optional":true,"field":"scn"},{"type":"string","optional":true,"field":"commit_scn"},{"type":"string","optional":true,"field":"lcr_position"},{"type":"string","optional":true,"field":"rs_id"},{"type":"int64","optional":true,"field":"ssn"},{"type":"int32","optional":true,"field":"redo_thread"},{"type":"string","optional":true,"field":"user_name"},{"type":"string","optional":true,"field":"redo_sql"},{"type":"string","optional":true,"field":"row_id"},{"type":"int64","optional":true,"field":"commit_ts_ms"},{"type":"string","optional":true,"field":"start_scn"},{"type":"int64","optional":true,"field":"start_ts_ms"},{"type":"int64","optional":true,"field":"txSeq"}`},
	"mongodb": {"io.debezium.connector.mongo.Source",
		`{"type":"string","optional":false,"field":"collection"},{"type":"int32","optional":false,"field":"ord"},{"type":"string","optional":true,"field":"lsid"},{"type":"int64","optional":true,"field":"txnNumber"},{"type":"int64","optional":true,"field":"wallTime"}`},
}

// ConnectorTopic is the topic the connector writes s to: server.db.schema.table
// for SQL Server (one topic prefix for several databases), server.schema.table
// for Oracle, server.db.collection for MongoDB.
func (s *Source) ConnectorTopic(connector string) string {
	switch connector {
	case "sqlserver":
		return s.Server + "." + s.DB + "." + s.Schema + "." + s.Table
	case "mongodb":
		return s.Server + "." + s.DB + "." + s.Table
	}
	return s.Server + "." + s.Schema + "." + s.Table
}

// ConnectorEnvelope renders a change as the connector (sqlserver or
// oracle) writes it, JsonConverter with schemas. fields are the
// connector's own source fields, in the schema's order, as a JSON object
// body without braces (e.g. `"change_lsn":"…","commit_lsn":"…","event_serial_no":1`);
// the common ones come from c. c.LSN, c.PrevLSN and c.TxID are unused.
func (s *Source) ConnectorEnvelope(connector string, c Change, fields string) (key, value []byte) {
	src := connectorSources[connector]
	topic := s.ConnectorTopic(connector)
	valueName := topic + ".Value"
	schema := `{"type":"struct","fields":[` + s.rowSchema(s.Cols, valueName, "before", true) + "," +
		s.rowSchema(s.Cols, valueName, "after", true) + `,{"type":"struct","fields":[` + commonSourceFields + "," + src.fields +
		`],"optional":false,"name":"` + src.schemaName + `","version":1,"field":"source"},` + transactionSchema +
		`,{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"}],"optional":false,"name":"` +
		topic + `.Envelope","version":2}`
	img := c.After
	if img == nil {
		img = c.Before
	}
	keySchema := strings.Replace(s.KeySchema(), s.Topic()+".Key", topic+".Key", 1)
	var kb strings.Builder
	kb.WriteString(`{"schema":` + keySchema + `,"payload":{`)
	for i, k := range s.Keys {
		if i > 0 {
			kb.WriteByte(',')
		}
		v, _ := json.Marshal(img[k])
		fmt.Fprintf(&kb, "%q:%s", k, v)
	}
	kb.WriteString("}}")
	snap := c.Snapshot
	if snap == "" {
		snap = "false"
	}
	commit := c.Commit.UTC()
	seen := commit.Add(250 * time.Millisecond)
	var vb bytes.Buffer
	fmt.Fprintf(&vb, `{"schema":%s,"payload":{"before":%s,"after":%s,"source":{"version":"3.6.1.Final","connector":%q,"name":%q,"ts_ms":%d,"snapshot":%q,"db":%q,"sequence":null,"ts_us":%d,"ts_ns":%d,%s},"transaction":null,"op":%q,"ts_ms":%d,"ts_us":%d,"ts_ns":%d}}`,
		schema, s.row(c.Before), s.row(c.After), connector, s.Server, commit.UnixMilli(), snap, s.DB, commit.UnixMicro(), commit.UnixNano(), fields,
		c.Op, seen.UnixMilli(), seen.UnixMicro(), seen.UnixNano())
	return []byte(kb.String()), vb.Bytes()
}

const mongoUpdateDescription = `{"type":"struct","fields":[{"type":"array","items":{"type":"string","optional":false},"optional":true,"field":"removedFields"},{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"updatedFields"},{"type":"array","items":{"type":"struct","fields":[{"type":"string","optional":false,"field":"field"},{"type":"int32","optional":false,"field":"size"}],"optional":false,"name":"io.debezium.connector.mongodb.changestream.truncatedarray","version":1},"optional":true,"field":"truncatedArrays"}],"optional":true,"name":"io.debezium.connector.mongodb.changestream.updatedescription","version":1,"field":"updateDescription"}`

// MongoChange is one change as Debezium's MongoDB connector reports it:
// the document (after; empty for deletes) in the BSON library's strict
// Extended JSON, as the connector writes it ({"_id" : {"$oid" : "…"},…}),
// the _id in relaxed Extended JSON for the key, the oplog time (whole
// seconds) and the order within it.
type MongoChange struct {
	Op       string // c, r, u, d
	ID       string // e.g. {"$oid": "5d505646cf6d4fe581014ab2"}, 1004, "abc"
	After    string
	Updated  string // updateDescription.updatedFields, for updates
	At       time.Time
	Ord      int
	Snapshot string
}

// MongoEnvelope renders a change as the MongoDB connector writes it to
// topic server.db.collection (s.Table is the collection), JsonConverter
// with schemas.
func (s *Source) MongoEnvelope(c MongoChange) (key, value []byte) {
	src := connectorSources["mongodb"]
	topic := s.ConnectorTopic("mongodb")
	schema := `{"type":"struct","fields":[{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"before"},` +
		`{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1,"field":"after"},` + mongoUpdateDescription +
		`,{"type":"struct","fields":[` + commonSourceFields + "," + src.fields + `],"optional":false,"name":"` + src.schemaName + `","version":1,"field":"source"}` +
		`,{"type":"string","optional":true,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},` + transactionSchema +
		`],"optional":false,"name":"` + topic + `.Envelope"}`
	idJSON, _ := json.Marshal(c.ID)
	key = []byte(`{"schema":{"type":"struct","fields":[{"type":"string","optional":false,"field":"id"}],"optional":false,"name":"` + topic + `.Key"},"payload":{"id":` + string(idJSON) + `}}`)
	after := "null"
	if c.After != "" {
		b, _ := json.Marshal(c.After)
		after = string(b)
	}
	upd := "null"
	if c.Op == "u" {
		b, _ := json.Marshal(c.Updated)
		upd = `{"removedFields":null,"updatedFields":` + string(b) + `,"truncatedArrays":null}`
	}
	snap := c.Snapshot
	if snap == "" {
		snap = "false"
	}
	at := c.At.UTC().Truncate(time.Second)
	seen := c.At.Add(180 * time.Millisecond)
	var vb bytes.Buffer
	fmt.Fprintf(&vb, `{"schema":%s,"payload":{"before":null,"after":%s,"updateDescription":%s,"source":{"version":"3.6.1.Final","connector":"mongodb","name":%q,"ts_ms":%d,"snapshot":%q,"db":%q,"sequence":null,"ts_us":%d,"ts_ns":%d,"collection":%q,"ord":%d,"lsid":null,"txnNumber":null,"wallTime":%d},"op":%q,"ts_ms":%d,"transaction":null}}`,
		schema, after, upd, s.Server, at.UnixMilli(), snap, s.DB, at.UnixMicro(), at.UnixNano(), s.Table, c.Ord, c.At.UnixMilli(), c.Op, seen.UnixMilli())
	return key, vb.Bytes()
}
