package debezium

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"
)

// Debezium's transaction metadata (provide.transaction.metadata=true).
//
// The connector writes a BEGIN and an END record per source transaction
// on <topic.prefix>.transaction, in commit order; the END counts the
// transaction's events per data collection. Each data event carries a
// transaction block: the transaction's id, its total_order in it and its
// data_collection_order. The events of one transaction spread over every
// table's topic and partition, and only the END's counts say when all
// have arrived: TxnMark (read from a data event) and TxRecord (a BEGIN or
// END) are what consumer/txlog and the sink count them with.

// Collection names a data event's data collection as the END record's
// data_collections do (Debezium's TableId identifier: catalog, schema and
// table, each when the connector has it): schema.table for PostgreSQL,
// db.table for MySQL and MariaDB and MongoDB (its collection),
// db.schema.table for SQL Server, Oracle and Db2.
func Collection(connector, db, schema, table string) string {
	switch connector {
	case "postgresql":
		db = ""
	case "mysql", "mariadb", "mongodb":
		schema = ""
	}
	var parts []string
	for _, p := range []string{db, schema, table} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ".")
}

// TransactionID is the part of a transaction id that names the
// transaction in its END record and in every one of its events alike.
// PostgreSQL's connector writes "<txId>:<lsn>", the LSN being each
// record's own (the END's is not its events'): the txId alone is kept
// (unique among the transactions in flight; pruning keeps no old ones).
func TransactionID(connector, id string) string {
	if connector == "postgresql" {
		if i := strings.IndexByte(id, ':'); i > 0 {
			return id[:i]
		}
	}
	return id
}

var (
	txnID    = []string{"transaction", "id"}
	txnOrder = []string{"transaction", "total_order"}
	srcConn  = []string{"source", "connector"}
	srcDB    = []string{"source", "db"}
	srcSch   = []string{"source", "schema"}
	srcTable = []string{"source", "table"}
	srcColl  = []string{"source", "collection"}
)

// txnMark reads a JSON data event's transaction block (nil: none); the
// connector is the record's, else the rule's. The source block is read
// first: the envelope's sub-object in hand is the source's already.
func (e *jsonEnvelope) txnMark(r *rule) *change.TxnMark {
	conn, db, schema, table := e.get(srcConn).Str, e.get(srcDB).Str, e.get(srcSch).Str, e.get(srcTable).Str
	if table == "" {
		table = e.get(srcColl).Str
	}
	id := e.get(txnID)
	if id.Type != gjson.String || id.Str == "" {
		return nil
	}
	if conn == "" {
		conn = r.Connector
	}
	return &change.TxnMark{Topic: r.TransactionTopic, ID: strings.Clone(TransactionID(conn, id.Str)), Order: e.get(txnOrder).Int(),
		Collection: r.collection(conn, db, schema, table)}
}

// collKey is a data collection's name and what it was made of.
type collKey struct{ conn, db, schema, table, name string }

// collection is Collection, remembering the topic's last answer: a
// topic's events name one table.
func (r *rule) collection(conn, db, schema, table string) string {
	if c := r.coll.Load(); c != nil && c.conn == conn && c.db == db && c.schema == schema && c.table == table {
		return c.name
	}
	c := &collKey{conn: strings.Clone(conn), db: strings.Clone(db), schema: strings.Clone(schema), table: strings.Clone(table)}
	c.name = Collection(conn, db, schema, table)
	r.coll.Store(c)
	return c.name
}

// avroTxnMark reads an Avro data event's transaction block (nil: none).
func avroTxnMark(r *rule, s *Schema, rec map[string]any) *change.TxnMark {
	str := func(path []string) string {
		v, _ := avroPath(s, rec, path)
		out, _ := v.(string)
		return out
	}
	id := str(txnID)
	if id == "" {
		return nil
	}
	var order int64
	switch v, _ := avroPath(s, rec, txnOrder); n := v.(type) {
	case int64:
		order = n
	case int32:
		order = int64(n)
	}
	table := str(srcTable)
	if table == "" {
		table = str(srcColl)
	}
	conn := str(srcConn)
	if conn == "" {
		conn = r.Connector
	}
	return &change.TxnMark{Topic: r.TransactionTopic, ID: TransactionID(conn, id), Order: order,
		Collection: r.collection(conn, str(srcDB), str(srcSch), table)}
}

// TxRecord is one record of a transaction metadata topic.
type TxRecord struct {
	// Status is BEGIN or END.
	Status string
	ID     string
	// Commit is the record's ts_ms: the transaction's time at the source
	// (zero when the record has none).
	Commit time.Time
	// Counts are the END's events per data collection.
	Counts map[string]int64
}

// TransactionRecord decodes a record of a transaction metadata topic,
// JSON (with or without the JsonConverter's schema) or Avro (through the
// Decoder's registry). A tombstone is ErrSkip.
func (d *Decoder) TransactionRecord(ctx context.Context, value []byte, headers ...Header) (TxRecord, error) {
	var out TxRecord
	v := trimSpace(bytesString(value))
	if v == "" || v == "null" {
		return out, ErrSkip
	}
	if v[0] == '{' {
		if !gjson.Valid(v) {
			return out, errors.New("transaction record is not JSON")
		}
		p := gjson.Parse(v)
		if pl := p.Get("payload"); p.Get("schema").Exists() && pl.Exists() {
			p = pl
		}
		out.Status, out.ID = p.Get("status").Str, p.Get("id").Str
		if ts := p.Get("ts_ms"); ts.Exists() {
			out.Commit = time.UnixMilli(ts.Int()).UTC()
		}
		if out.Status == "END" {
			out.Counts = map[string]int64{}
			p.Get("data_collections").ForEach(func(_, c gjson.Result) bool {
				out.Counts[c.Get("data_collection").Str] += c.Get("event_count").Int()
				return true
			})
		}
		return out, out.check()
	}
	s, rec, _, _, err := d.decodeRecord(ctx, value, headers, false, true)
	if err != nil {
		return out, fmt.Errorf("transaction record: %w", err)
	}
	str := func(name string) string {
		v, _ := avroPath(s.root, rec, []string{name})
		out, _ := v.(string)
		return out
	}
	out.Status, out.ID = str("status"), str("id")
	if v, _ := avroPath(s.root, rec, []string{"ts_ms"}); v != nil {
		if n, ok := v.(int64); ok {
			out.Commit = time.UnixMilli(n).UTC()
		}
	}
	if out.Status == "END" {
		out.Counts = map[string]int64{}
		v, _ := avroPath(s.root, rec, []string{"data_collections"})
		if m, ok := v.(map[string]any); ok && len(m) == 1 { // a union's wrapper
			for _, inner := range m {
				v = inner
			}
		}
		list, _ := v.([]any)
		for _, item := range list {
			c, _ := item.(map[string]any)
			name, _ := c["data_collection"].(string)
			n, _ := c["event_count"].(int64)
			out.Counts[name] += n
		}
	}
	return out, out.check()
}

// check says what a decoded record lacks.
func (r TxRecord) check() error {
	switch {
	case r.Status != "BEGIN" && r.Status != "END":
		return fmt.Errorf("transaction record has status %q, not BEGIN or END", r.Status)
	case r.ID == "":
		return errors.New("transaction record has no id")
	case r.Status == "END" && r.Commit.IsZero():
		return errors.New("transaction END record has no ts_ms")
	}
	return nil
}

// noteTxn warns, once per topic, of a streamed event that has no
// transaction block although its table names a transaction topic: the
// connector lacks provide.transaction.metadata=true, and every
// transaction would wait until given up.
func (d *Decoder) noteTxn(r *rule, ev *change.Event) {
	if ev.Txn != nil || ev.Op == change.OpRead {
		return
	}
	r.noTxn.Do(func() {
		d.log.Warn("an event has no transaction block although its table names transaction_topic: set provide.transaction.metadata=true on the connector",
			zap.String("topic", r.Topic), zap.String("transaction_topic", r.TransactionTopic))
	})
}
