package debezium_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// sqlserverCases are SQL Server's column types as Debezium 3.6's SQL
// Server connector describes them in its default modes
// (time.precision.mode=adaptive, decimal.handling.mode=precise).
var sqlserverCases = []typeCase{
	{"id", `{"type":"int32","optional":false}`, "integer", 1, "1"},
	{"tiny", `{"type":"int16","optional":true}`, "smallint", 255, "255"},
	{"flag", `{"type":"boolean","optional":true}`, "boolean", true, "true"}, // bit
	{"amount", `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}}`,
		"numeric", scdtest.DecimalB64("-123456"), "-1234.56"},
	{"cash", `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"4","connect.decimal.precision":"19"}}`,
		"numeric", scdtest.DecimalB64("9223372036854775807"), "922337203685477.5807"}, // money
	{"ratio", `{"type":"double","optional":true}`, "double precision", 0.125, "0.125"}, // float
	{"born", `{"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1}`, "date", 20513, "2026-03-01"},
	{"at7", `{"type":"int64","optional":true,"name":"io.debezium.time.NanoTime","version":1}`, "time without time zone", int64(36930123456700), "10:15:30.123456"},             // time(7)
	{"at3", `{"type":"int32","optional":true,"name":"io.debezium.time.Time","version":1}`, "time without time zone", 36930123, "10:15:30.123"},                                 // time(3)
	{"dt", `{"type":"int64","optional":true,"name":"io.debezium.time.Timestamp","version":1}`, "timestamp without time zone", int64(1772360130123), "2026-03-01 10:15:30.123"}, // datetime
	{"dt2", `{"type":"int64","optional":true,"name":"io.debezium.time.NanoTimestamp","version":1}`, "timestamp without time zone", int64(1772360130123456700), "2026-03-01 10:15:30.123456"},
	{"dto", `{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1}`, "timestamp with time zone", "2026-03-01T10:15:30.1234567+01:00", "2026-03-01 09:15:30.123456+00"}, // datetimeoffset
	{"guid", `{"type":"string","optional":true}`, "text", "6F9619FF-8B86-D011-B42D-00C04FC964FF", "6F9619FF-8B86-D011-B42D-00C04FC964FF"},                                                               // uniqueidentifier
	{"doc", `{"type":"string","optional":true,"name":"io.debezium.data.Xml","version":1}`, "xml", "<a>1</a>", "<a>1</a>"},
	{"raw", `{"type":"bytes","optional":true}`, "bytea", b64([]byte{0xca, 0xfe}), `\xcafe`}, // varbinary
}

// oracleCases are Oracle's column types as Debezium 3.6's Oracle connector
// describes them (decimal.handling.mode=precise, time.precision.mode=adaptive,
// interval.handling.mode numeric and string).
var oracleCases = []typeCase{
	{"ID", `{"type":"int32","optional":false}`, "integer", 1, "1"}, // NUMBER(9,0)
	{"BIG", `{"type":"int64","optional":true}`, "bigint", int64(123456789012345678), "123456789012345678"},
	{"PRICE", `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"10"}}`,
		"numeric", scdtest.DecimalB64("150"), "1.50"}, // NUMBER(10,2)
	{"ANYNUM", `{"type":"struct","fields":[{"type":"int32","optional":false,"field":"scale"},{"type":"bytes","optional":false,"field":"value"}],"optional":true,"name":"io.debezium.data.VariableScaleDecimal","version":1,"doc":"Variable scaled decimal"}`,
		"numeric", map[string]any{"scale": 4, "value": scdtest.DecimalB64("-31415926")}, "-3141.5926"}, // NUMBER
	{"DBL", `{"type":"double","optional":true}`, "double precision", 2.5, "2.5"},                                                                                            // BINARY_DOUBLE
	{"DAY", `{"type":"int64","optional":true,"name":"io.debezium.time.Timestamp","version":1}`, "timestamp without time zone", int64(1772360130000), "2026-03-01 10:15:30"}, // DATE
	{"TS6", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1}`, "timestamp without time zone", int64(1772360130123456), "2026-03-01 10:15:30.123456"},
	{"TS9", `{"type":"int64","optional":true,"name":"io.debezium.time.NanoTimestamp","version":1}`, "timestamp without time zone", int64(1772360130123456789), "2026-03-01 10:15:30.123456"},
	{"TSTZ", `{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1}`, "timestamp with time zone", "2026-03-01T10:15:30.123456+02:00", "2026-03-01 08:15:30.123456+00"},
	{"TSLTZ", `{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1}`, "timestamp with time zone", "2026-03-01T08:15:30.123456Z", "2026-03-01 08:15:30.123456+00"},
	{"IDS", `{"type":"int64","optional":true,"name":"io.debezium.time.MicroDuration","version":1}`, "interval", int64(-93784500000), "-26:03:04.5"}, // INTERVAL DAY TO SECOND, numeric
	{"IYM", `{"type":"string","optional":true,"name":"io.debezium.time.Interval","version":1}`, "interval", "P1Y2M0DT0H0M0S", "1 year 2 mons"},      // INTERVAL YEAR TO MONTH, string
	{"NAME", `{"type":"string","optional":true}`, "text", "Ø'Neil", "Ø'Neil"},                                                                       // VARCHAR2
	{"BLOB1", `{"type":"bytes","optional":true}`, "bytea", b64([]byte{0, 0xff}), `\x00ff`},
}

// SQL Server's and Oracle's types reach the history table as DESIGN.md
// section 4 maps them, on envelopes built as their connectors write them.
func TestSQLServerAndOracleTypes(t *testing.T) {
	for _, tc := range []struct {
		connector string
		cases     []typeCase
		fields    string
	}{
		{"sqlserver", sqlserverCases, `"schema":"dbo","table":"typed","change_lsn":"0000002d:00000c80:0002","commit_lsn":"0000002d:00000c88:0003","event_serial_no":1`},
		{"oracle", oracleCases, `"schema":"INV","table":"TYPED","txId":"0a001b00f5030000","scn":"2956043","commit_scn":"2956045","lcr_position":null,"rs_id":" 0x000059.00023e16.0010 ","ssn":0,"redo_thread":1,"user_name":"INV","redo_sql":null,"row_id":"AAASgjAAMAAAACnAAA","commit_ts_ms":1772360130000,"start_scn":"2956040","start_ts_ms":1772360129000,"txSeq":1`},
	} {
		t.Run(tc.connector, func(t *testing.T) {
			ctx := context.Background()
			pool := newPool(t)
			key := tc.cases[0].col
			src := &scdtest.Source{Server: "erp", DB: "erp", Schema: "dbo", Table: "typed", Keys: []string{key}}
			for _, c := range tc.cases {
				src.Cols = append(src.Cols, scdtest.Col{Name: c.col, Schema: c.schema})
			}
			d := debezium.New([]debezium.Rule{{Topic: src.ConnectorTopic(tc.connector), Target: "typed_history",
				SequenceBy: config.DefaultSequenceBy[tc.connector], ValidFrom: "source.ts_ms"}}, nil, nil)
			row := scdtest.Row{}
			for _, c := range tc.cases {
				row[c.col] = c.value
			}
			k, v := src.ConnectorEnvelope(tc.connector, scdtest.Change{Op: "c", After: row, Commit: time.Date(2026, 3, 1, 10, 15, 30, 0, time.UTC)}, tc.fields)
			s := newSink(t, pool, sink.TableSpec{Target: "typed_history"})
			if _, err := s.Apply(ctx, sink.Batch{Events: decodeAll(t, d, src.ConnectorTopic(tc.connector), [][2][]byte{{k, v}})}); err != nil {
				t.Fatal(err)
			}
			types := map[string]string{}
			rows, _ := pool.Query(ctx, `SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
				WHERE attrelid = 'typed_history'::regclass AND attnum > 0 AND NOT attisdropped`)
			var name, typ string
			for rows.Next() {
				if err := rows.Scan(&name, &typ); err != nil {
					t.Fatal(err)
				}
				types[name] = typ
			}
			cols := make([]string, len(tc.cases))
			for i, c := range tc.cases {
				cols[i] = c.col
			}
			got := textsBy(t, pool, "typed_history", key, 1, cols)
			for _, c := range tc.cases {
				if types[c.col] != c.pgType {
					t.Errorf("%s: column type %s, want %s", c.col, types[c.col], c.pgType)
				}
				if g := got[c.col]; g == nil || *g != c.want {
					t.Errorf("%s (%s) = %v, want %s", c.col, c.pgType, deref(g), c.want)
				}
			}
		})
	}
}

// The default sequence_by of oracle and sqlserver, on their envelopes:
// Oracle's SCNs are decimal strings without padding (compared as
// numbers) and not unique — a transaction's changes share its commit SCN
// and may share an SCN, and rs_id (the redo record) and ssn order them;
// a snapshot record has no commit SCN and is anchored by the consumer.
// SQL Server's primary-key update is a delete and a create with the same
// LSNs and serial numbers 1 and 2.
func TestOracleAndSQLServerOrder(t *testing.T) {
	oracle := func(scn, commit, rs string, ssn int) string {
		c := "null"
		if commit != "" {
			c = fmt.Sprintf("%q", commit)
		}
		return fmt.Sprintf(`"schema":"INV","table":"ACCOUNTS","txId":"0a001b00f5030000","scn":%q,"commit_scn":%s,"lcr_position":null,"rs_id":%q,"ssn":%d,"redo_thread":1,"user_name":"INV","redo_sql":null,"row_id":"AAASgjAAMAAAACnAAA","commit_ts_ms":1772360130000,"start_scn":null,"start_ts_ms":null,"txSeq":null`,
			scn, c, rs, ssn)
	}
	sqlserver := func(commit, chg string, serial int) string {
		return fmt.Sprintf(`"schema":"dbo","table":"accounts","change_lsn":%q,"commit_lsn":%q,"event_serial_no":%d`, chg, commit, serial)
	}
	cases := []struct {
		connector string
		fields    []string // in commit order
	}{
		{"oracle", []string{
			oracle("999999", "1000002", " 0x000059.00023e16.0010 ", 0), // a transaction committed at 1000002
			oracle("1000001", "1000002", " 0x000059.00023e20.0010 ", 0),
			oracle("1000001", "1000002", " 0x000059.00023e20.0010 ", 1), // the same SCN and redo record
			oracle("1000001", "1000002", " 0x00005a.00000002.0010 ", 0), // after a log switch
			oracle("998", "10000000", " 0x00005a.00000100.0010 ", 0),    // a long transaction started earlier, committed later
		}},
		{"sqlserver", []string{
			sqlserver("0000002d:00000c88:0003", "0000002d:00000c80:0002", 1), // the update's delete
			sqlserver("0000002d:00000c88:0003", "0000002d:00000c80:0002", 2), // and create
			sqlserver("0000002d:00000c90:0001", "0000002d:00000c8f:0002", 1),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.connector, func(t *testing.T) {
			src := &scdtest.Source{Server: "erp", DB: "erp", Schema: "dbo", Table: "accounts", Keys: []string{"id"},
				Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`}, {Name: "qty", Schema: `{"type":"int32","optional":true}`}}}
			topic := src.ConnectorTopic(tc.connector)
			d := debezium.New([]debezium.Rule{{Topic: topic, Target: "accounts_history", SequenceBy: config.DefaultSequenceBy[tc.connector], ValidFrom: "source.ts_ms"}}, nil, nil)
			var prev change.Seq
			for i, f := range tc.fields {
				k, v := src.ConnectorEnvelope(tc.connector, scdtest.Change{Op: "u", After: scdtest.Row{"id": 1, "qty": i}, Commit: time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)}, f)
				ev, err := d.Decode(context.Background(), change.Origin{Partition: change.Partition{Topic: topic}}, k, v)
				if err != nil {
					t.Fatalf("change %d: %v", i, err)
				}
				if prev != nil && prev.Compare(ev.Seq) >= 0 {
					t.Errorf("change %d %s does not sort after change %d %s", i, ev.Seq, i-1, prev)
				}
				prev = ev.Seq
			}
			if tc.connector == "oracle" {
				k, v := src.ConnectorEnvelope("oracle", scdtest.Change{Op: "r", After: scdtest.Row{"id": 2}, Snapshot: "true", Commit: time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)},
					oracle("2956000", "", "", 0))
				ev, err := d.Decode(context.Background(), change.Origin{Partition: change.Partition{Topic: topic}}, k, v)
				if err != nil || ev.Seq != nil {
					t.Errorf("a snapshot record without a commit SCN: seq %v, %v; want none (anchored)", ev.Seq, err)
				}
			}
		})
	}
}

// textsBy is texts for a key column of any name.
func textsBy(t *testing.T, pool *pgxpool.Pool, table, keyCol string, id int, cols []string) map[string]*string {
	t.Helper()
	sel := make([]string, len(cols))
	for i, c := range cols {
		sel[i] = pgx.Identifier{c}.Sanitize() + "::text"
	}
	vals := make([]*string, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	q := fmt.Sprintf("SELECT %s FROM %s WHERE %s = $1 AND is_current", strings.Join(sel, ", "), table, pgx.Identifier{keyCol}.Sanitize())
	if err := pool.QueryRow(context.Background(), q, id).Scan(ptrs...); err != nil {
		t.Fatalf("reading %s: %v", table, err)
	}
	out := map[string]*string{}
	for i, c := range cols {
		out[c] = vals[i]
	}
	return out
}
