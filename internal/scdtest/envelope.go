package scdtest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Col is a source column as Debezium's JsonConverter describes it: Schema
// is the field's schema without its "field" member, e.g.
// `{"type":"int32","optional":false}`.
type Col struct {
	Name   string
	Schema string
}

// Source is a source table as a Debezium 3.6 PostgreSQL connector
// (pgoutput, JsonConverter with schemas) describes it in its envelopes.
type Source struct {
	Server, DB, Schema, Table string
	Cols                      []Col
	Keys                      []string
}

// Topic is the table's topic: server.schema.table.
func (s *Source) Topic() string { return s.Server + "." + s.Schema + "." + s.Table }

func (s *Source) rowSchema(cols []Col, name, field string, optional bool) string {
	var b strings.Builder
	b.WriteString(`{"type":"struct","fields":[`)
	for i, c := range cols {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strings.TrimSuffix(c.Schema, "}"))
		fmt.Fprintf(&b, `,"field":%q}`, c.Name)
	}
	fmt.Fprintf(&b, `],"optional":%t,"name":%q`, optional, name)
	if field != "" {
		fmt.Fprintf(&b, `,"field":%q`, field)
	}
	b.WriteByte('}')
	return b.String()
}

const sourceSchema = `{"type":"struct","fields":[{"type":"string","optional":false,"field":"version"},{"type":"string","optional":false,"field":"connector"},{"type":"string","optional":false,"field":"name"},{"type":"int64","optional":false,"field":"ts_ms"},{"type":"string","optional":true,"name":"io.debezium.data.Enum","version":1,"parameters":{"allowed":"true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},"default":"false","field":"snapshot"},{"type":"string","optional":false,"field":"db"},{"type":"string","optional":true,"field":"sequence"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"},{"type":"string","optional":false,"field":"schema"},{"type":"string","optional":false,"field":"table"},{"type":"int64","optional":true,"field":"txId"},{"type":"int64","optional":true,"field":"lsn"},{"type":"int64","optional":true,"field":"xmin"},{"type":"string","optional":true,"field":"origin"},{"type":"int64","optional":true,"field":"origin_lsn"}],"optional":false,"name":"io.debezium.connector.postgresql.Source","version":1,"field":"source"}`

const transactionSchema = `{"type":"struct","fields":[{"type":"string","optional":false,"field":"id"},{"type":"int64","optional":false,"field":"total_order"},{"type":"int64","optional":false,"field":"data_collection_order"}],"optional":true,"name":"event.block","version":1,"field":"transaction"}`

// ValueSchema is the envelope's schema, the same bytes in every message.
func (s *Source) ValueSchema() string {
	valueName := s.Topic() + ".Value"
	return `{"type":"struct","fields":[` + s.rowSchema(s.Cols, valueName, "before", true) + "," +
		s.rowSchema(s.Cols, valueName, "after", true) + "," + sourceSchema + "," + transactionSchema +
		`,{"type":"string","optional":false,"field":"op"},{"type":"int64","optional":true,"field":"ts_ms"},{"type":"int64","optional":true,"field":"ts_us"},{"type":"int64","optional":true,"field":"ts_ns"}],"optional":false,"name":"` +
		s.Topic() + `.Envelope","version":2}`
}

// KeySchema is the key's schema: the key columns.
func (s *Source) KeySchema() string {
	var cols []Col
	for _, k := range s.Keys {
		for _, c := range s.Cols {
			if c.Name == k {
				cols = append(cols, c)
			}
		}
	}
	return s.rowSchema(cols, s.Topic()+".Key", "", false)
}

// Row is a row image in Debezium's JSON encoding: values are what the
// JsonConverter writes (base64 decimals, day counts, ISO strings ...); use
// the helpers below. Columns missing from the map are null.
type Row map[string]any

// Change is one change as the connector reports it.
type Change struct {
	Op       string // c, r, u, d, t
	Before   Row    // nil: null (default replica identity updates)
	After    Row
	LSN      int64
	PrevLSN  int64 // for source.sequence; 0 writes null
	TxID     int64
	Commit   time.Time // source.ts_ms and friends
	Snapshot string    // default "false"
	// Txn, when set, is the event's transaction block
	// (provide.transaction.metadata=true); nil writes null.
	Txn *TxnBlock
}

// TxnBlock is a data event's transaction block.
type TxnBlock struct {
	ID                  string // "<txId>:<lsn>", as PostgreSQL's connector names it
	TotalOrder          int64  // the event's place in the transaction, from 1
	DataCollectionOrder int64  // its place among the transaction's events of its table
}

// transactionValueSchema is the schema of a transaction metadata record.
const transactionValueSchema = `{"type":"struct","fields":[{"type":"string","optional":false,"field":"status"},{"type":"string","optional":false,"field":"id"},{"type":"int64","optional":true,"field":"event_count"},{"type":"array","items":{"type":"struct","fields":[{"type":"string","optional":false,"field":"data_collection"},{"type":"int64","optional":false,"field":"event_count"}],"optional":false},"optional":true,"field":"data_collections"},{"type":"int64","optional":false,"field":"ts_ms"}],"optional":false,"name":"io.debezium.connector.common.TransactionMetadataValue","version":1}`

// TransactionRecord renders a BEGIN (counts nil) or END record of the
// transaction topic <server>.transaction, as the JsonConverter writes it
// with schemas: counts are the END's events per data collection
// ("schema.table").
func TransactionRecord(id string, commit time.Time, counts map[string]int64) (key, value []byte) {
	key = []byte(fmt.Sprintf(`{"schema":{"type":"struct","fields":[{"type":"string","optional":false,"field":"id"}],"optional":false,"name":"io.debezium.connector.common.TransactionMetadataKey","version":1},"payload":{"id":%q}}`, id))
	if counts == nil {
		return key, []byte(fmt.Sprintf(`{"schema":%s,"payload":{"status":"BEGIN","id":%q,"event_count":null,"data_collections":null,"ts_ms":%d}}`,
			transactionValueSchema, id, commit.UnixMilli()))
	}
	names := make([]string, 0, len(counts))
	var total int64
	for n, c := range counts {
		names = append(names, n)
		total += c
	}
	sort.Strings(names)
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"data_collection":%q,"event_count":%d}`, n, counts[n])
	}
	return key, []byte(fmt.Sprintf(`{"schema":%s,"payload":{"status":"END","id":%q,"event_count":%d,"data_collections":[%s],"ts_ms":%d}}`,
		transactionValueSchema, id, total, b.String(), commit.UnixMilli()))
}

func (s *Source) row(r Row) string {
	if r == nil {
		return "null"
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, c := range s.Cols {
		if i > 0 {
			b.WriteByte(',')
		}
		v, _ := json.Marshal(r[c.Name])
		fmt.Fprintf(&b, "%q:%s", c.Name, v)
	}
	b.WriteByte('}')
	return b.String()
}

// Envelope renders one change as the Kafka key and value the connector
// writes (schemas on). A delete's tombstone is a separate record.
func (s *Source) Envelope(c Change) (key, value []byte) {
	img := c.After
	if img == nil {
		img = c.Before
	}
	var kb strings.Builder
	kb.WriteString(`{"schema":` + s.KeySchema() + `,"payload":{`)
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
	prev := "null"
	if c.PrevLSN != 0 {
		prev = strconv.Quote(strconv.FormatInt(c.PrevLSN, 10))
	}
	seq, _ := json.Marshal(fmt.Sprintf("[%s,%q]", prev, strconv.FormatInt(c.LSN, 10)))
	commit := c.Commit.UTC()
	seen := commit.Add(37 * time.Millisecond)
	txn := "null"
	if c.Txn != nil {
		txn = fmt.Sprintf(`{"id":%q,"total_order":%d,"data_collection_order":%d}`, c.Txn.ID, c.Txn.TotalOrder, c.Txn.DataCollectionOrder)
	}
	var vb bytes.Buffer
	fmt.Fprintf(&vb, `{"schema":%s,"payload":{"before":%s,"after":%s,"source":{"version":"3.6.1.Final","connector":"postgresql","name":%q,"ts_ms":%d,"snapshot":%q,"db":%q,"sequence":%s,"ts_us":%d,"ts_ns":%d,"schema":%q,"table":%q,"txId":%d,"lsn":%d,"xmin":null,"origin":null,"origin_lsn":null},"transaction":%s,"op":%q,"ts_ms":%d,"ts_us":%d,"ts_ns":%d}}`,
		s.ValueSchema(), s.row(c.Before), s.row(c.After), s.Server, commit.UnixMilli(), snap, s.DB, seq,
		commit.UnixMicro(), commit.UnixNano(), s.Schema, s.Table, c.TxID, c.LSN, txn, c.Op,
		seen.UnixMilli(), seen.UnixMicro(), seen.UnixNano())
	return []byte(kb.String()), vb.Bytes()
}

// DecimalB64 encodes an unscaled integer (decimal text without the point,
// e.g. "-1" for -0.01 at scale 2) as Connect's Decimal: base64 of its
// big-endian two's complement.
func DecimalB64(unscaled string) string {
	n, ok := new(big.Int).SetString(unscaled, 10)
	if !ok {
		panic("DecimalB64: " + unscaled)
	}
	var raw []byte
	if n.Sign() >= 0 {
		raw = n.Bytes()
		if len(raw) == 0 || raw[0]&0x80 != 0 {
			raw = append([]byte{0}, raw...)
		}
	} else {
		// two's complement: 2^(8k) + n for the smallest k that fits
		k := len(new(big.Int).Neg(n).Bytes())
		if k == 0 {
			k = 1
		}
		for {
			m := new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), uint(8*k)), n)
			raw = m.Bytes()
			if len(raw) == k && raw[0]&0x80 != 0 {
				break
			}
			k++
		}
	}
	return base64.StdEncoding.EncodeToString(raw)
}

// Days is io.debezium.time.Date: days since 1970-01-01.
func Days(t time.Time) int64 { return int64(t.Sub(time.Unix(0, 0).UTC()).Hours() / 24) }

// Zoned is io.debezium.time.ZonedTimestamp: UTC, six fractional digits, Z.
func Zoned(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z") }
