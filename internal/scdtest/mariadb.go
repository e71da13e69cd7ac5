package scdtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Binlog is where a MariaDB change sits, as Debezium's MariaDB connector
// (3.5/3.6, JsonConverter with schemas) reports it in source: the GTID of
// its transaction ("domain-server-seq"; empty for snapshot reads, which
// carry null), the binlog file and the position of its rows event, the
// row's index within that event, and the server id of the server that
// wrote it first (a replica's binlog keeps the primary's). TxOrder, when
// set, is the change's place in its transaction (1, 2, …), written as the
// transaction block of provide.transaction.metadata=true (id the GTID,
// total_order and data_collection_order TxOrder: one table).
type Binlog struct {
	GTID     string
	File     string
	Pos      int64
	Row      int
	ServerID int64
	Thread   int64
	TxOrder  int64
}

const mariadbSourceSchema = `{"type":"struct","fields":[{"type":"string","optional":false,"field":"version"},{"type":"string","optional":false,"field":"connector"},{"type":"string","optional":false,"field":"name"},{"type":"int64","optional":false,"field":"ts_ms"},{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},"default":"false","field":"snapshot"},{"type":"string","optional":false,"field":"db"},{"type":"string","optional":true,"field":"sequence"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"},{"type":"string","optional":true,"field":"table"},{"type":"int64","optional":false,"field":"server_id"},{"type":"string","optional":true,"field":"gtid"},{"type":"string","optional":false,"field":"file"},{"type":"int64","optional":false,"field":"pos"},{"type":"int32","optional":false,"field":"row"},{"type":"int64","optional":true,"field":"thread"},{"type":"string","optional":true,"field":"query"}],"optional":false,"name":"io.debezium.connector.mariadb.Source","version":1,"field":"source"}`

// MariaDBTopic is the topic Debezium's MariaDB connector writes the table
// to: server.database.table (s.DB; s.Schema is unused).
func (s *Source) MariaDBTopic() string { return s.Server + "." + s.DB + "." + s.Table }

// MariaDBValueSchema is the envelope's schema as the MariaDB connector
// writes it.
func (s *Source) MariaDBValueSchema() string {
	valueName := s.MariaDBTopic() + ".Value"
	return `{"type":"struct","fields":[` + s.rowSchema(s.Cols, valueName, "before", true) + "," +
		s.rowSchema(s.Cols, valueName, "after", true) + "," + mariadbSourceSchema + "," + transactionSchema +
		`,{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"}],"optional":false,"name":"` +
		s.MariaDBTopic() + `.Envelope","version":2}`
}

// MariaDBEnvelope renders one change as the MariaDB connector writes it
// (c.LSN, c.PrevLSN and c.TxID are unused): source.ts_ms is the commit
// time in whole seconds, as MariaDB's binlog gives it (so are ts_us and
// ts_ns), updates and deletes carry full before images (binlog_row_image
// FULL).
func (s *Source) MariaDBEnvelope(c Change, b Binlog) (key, value []byte) {
	img := c.After
	if img == nil {
		img = c.Before
	}
	var kb strings.Builder
	keySchema := strings.Replace(s.KeySchema(), s.Topic()+".Key", s.MariaDBTopic()+".Key", 1)
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
	gtid := "null"
	if b.GTID != "" {
		gtid = fmt.Sprintf("%q", b.GTID)
	}
	thread := "null"
	if b.Thread != 0 {
		thread = fmt.Sprint(b.Thread)
	}
	tx := "null"
	if b.TxOrder > 0 {
		tx = fmt.Sprintf(`{"id":%q,"total_order":%d,"data_collection_order":%d}`, b.GTID, b.TxOrder, b.TxOrder)
	}
	commit := c.Commit.UTC().Truncate(time.Second)
	seen := c.Commit.UTC().Add(412 * time.Millisecond)
	var vb bytes.Buffer
	fmt.Fprintf(&vb, `{"schema":%s,"payload":{"before":%s,"after":%s,"source":{"version":"3.5.0.Final","connector":"mariadb","name":%q,"ts_ms":%d,"snapshot":%q,"db":%q,"sequence":null,"ts_us":%d,"ts_ns":%d,"table":%q,"server_id":%d,"gtid":%s,"file":%q,"pos":%d,"row":%d,"thread":%s,"query":null},"transaction":%s,"op":%q,"ts_ms":%d,"ts_us":%d,"ts_ns":%d}}`,
		s.MariaDBValueSchema(), s.row(c.Before), s.row(c.After), s.Server, commit.UnixMilli(), snap, s.DB,
		commit.UnixMicro(), commit.UnixNano(), s.Table, b.ServerID, gtid, b.File, b.Pos, b.Row, thread, tx, c.Op,
		seen.UnixMilli(), seen.UnixMicro(), seen.UnixNano())
	return []byte(kb.String()), vb.Bytes()
}
