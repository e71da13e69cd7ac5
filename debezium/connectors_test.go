package debezium

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Each connector's default sequence_by (DESIGN.md section 3) orders its
// own envelopes as the source committed them, whatever order they arrive
// in: MySQL by binlog file (compared as a string), position and row; SQL
// Server by commit LSN, change LSN and event serial number; PostgreSQL by
// LSN, or by source.sequence whose first element may be null.
func TestConnectorSequences(t *testing.T) {
	mysqlSource := func(file string, pos, row int) string {
		return fmt.Sprintf(`{"version":"3.6.1.Final","connector":"mysql","name":"inv","ts_ms":1767225600000,"snapshot":"false","db":"inv",
			"sequence":null,"ts_us":1767225600000000,"ts_ns":1767225600000000000,"table":"items","server_id":223344,"gtid":null,
			"file":%q,"pos":%d,"row":%d,"thread":7,"query":null}`, file, pos, row)
	}
	sqlserverSource := func(commit, chg string, serial int) string {
		return fmt.Sprintf(`{"version":"3.6.1.Final","connector":"sqlserver","name":"erp","ts_ms":1767225600000,"snapshot":"false",
			"db":"erp","sequence":null,"ts_us":1767225600000000,"ts_ns":1767225600000000000,"schema":"dbo","table":"items",
			"change_lsn":%q,"commit_lsn":%q,"event_serial_no":%d}`, chg, commit, serial)
	}
	pgSource := func(seq string, lsn int) string {
		return fmt.Sprintf(`{"version":"3.6.1.Final","connector":"postgresql","name":"shop","ts_ms":1767225600000,"snapshot":"false",
			"db":"shop","sequence":%q,"ts_us":1767225600000000,"ts_ns":1767225600000000000,"schema":"public","table":"items",
			"txId":744,"lsn":%d,"xmin":null}`, seq, lsn)
	}
	cases := []struct {
		name    string
		seqBy   []string
		sources []string // in commit order
	}{
		{"mysql", []string{"source.file", "source.pos", "source.row"}, []string{
			mysqlSource("mysql-bin.000009", 154, 0), mysqlSource("mysql-bin.000009", 154, 1), mysqlSource("mysql-bin.000009", 900, 0),
			mysqlSource("mysql-bin.000010", 4, 0), mysqlSource("mysql-bin.000010", 4, 2), mysqlSource("mysql-bin.000100", 4, 0)}},
		{"sqlserver", []string{"source.commit_lsn", "source.change_lsn", "source.event_serial_no"}, []string{
			sqlserverSource("0000002d:00000c88:0003", "0000002d:00000c80:0002", 1), sqlserverSource("0000002d:00000c88:0003", "0000002d:00000c80:0002", 2),
			sqlserverSource("0000002d:00000c88:0003", "0000002d:00000c88:0002", 1), sqlserverSource("0000002e:00000010:0001", "0000002e:00000008:0002", 1)}},
		{"postgresql lsn", []string{"source.lsn"}, []string{pgSource(`[null,"100"]`, 100), pgSource(`["100","180"]`, 180), pgSource(`["180","9000000000"]`, 9000000000)}},
		{"postgresql sequence", []string{"source.sequence"}, []string{pgSource(`[null,"100"]`, 100), pgSource(`["100","180"]`, 180), pgSource(`["100","200"]`, 200), pgSource(`["180","190"]`, 190)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := New([]Rule{{Topic: "t", Target: "items_history", Keys: []string{"sku"}, SequenceBy: tc.seqBy, ValidFrom: "source.ts_ms"}}, nil, nil)
			type got struct {
				want int
				seq  change.Seq
			}
			var evs []got
			for _, i := range rand.New(rand.NewPCG(1, 2)).Perm(len(tc.sources)) {
				v := fmt.Sprintf(`{"before":null,"after":{"sku":"X","qty":%d},"source":%s,"transaction":null,"op":"u","ts_ms":1767225600100}`, i, tc.sources[i])
				ev, err := d.Decode(context.Background(), change.Origin{Partition: change.Partition{Topic: "t"}}, []byte(`{"sku":"X"}`), []byte(v))
				if err != nil {
					t.Fatalf("source %d: %v", i, err)
				}
				evs = append(evs, got{i, ev.Seq})
			}
			sort.Slice(evs, func(a, b int) bool { return evs[a].seq.Compare(evs[b].seq) < 0 })
			for i, e := range evs {
				if e.want != i {
					t.Fatalf("position %d holds source %d (%s)", i, e.want, e.seq)
				}
			}
		})
	}
}
