package debezium

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Each connector's default sequence_by (DESIGN.md section 3) orders its
// own envelopes as the source committed them, whatever order they arrive
// in: MySQL by binlog file (compared as a string), position and row;
// MariaDB by its GTID's number within the domain across a failover; SQL
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
	// A MariaDB primary that rotated its binlog to .000005, then its
	// promoted replica, whose binlog starts at .000001: the GTID's number
	// in domain 0 goes on rising ("0-1-10" after "0-1-9", "0-2-11" after
	// "0-1-10"), file and position do not.
	mariadbSource := func(gtid, file string, pos, row, server int) string {
		return fmt.Sprintf(`{"version":"3.5.0.Final","connector":"mariadb","name":"inv","ts_ms":1767225600000,"snapshot":"false","db":"inv",
			"sequence":null,"ts_us":1767225600000000,"ts_ns":1767225600000000000,"table":"items","server_id":%d,"gtid":%q,
			"file":%q,"pos":%d,"row":%d,"thread":7,"query":null}`, server, gtid, file, pos, row)
	}
	mysqlGTID := func(gtid string, pos int) string {
		return fmt.Sprintf(`{"version":"3.6.1.Final","connector":"mysql","name":"inv","ts_ms":1767225600000,"snapshot":"false","db":"inv",
			"sequence":null,"ts_us":1767225600000000,"ts_ns":1767225600000000000,"table":"items","server_id":1,"gtid":%q,
			"file":"mysql-bin.000003","pos":%d,"row":0,"thread":7,"query":null}`, gtid, pos)
	}
	// MySQL 8 with GTIDs: ts_us is the original commit time, kept by a
	// replica; positions start again on the new primary.
	mysqlCommit := func(tsUS int64, file string, pos, row int) string {
		return fmt.Sprintf(`{"version":"3.6.1.Final","connector":"mysql","name":"inv","ts_ms":%d,"snapshot":"false","db":"inv",
			"sequence":null,"ts_us":%d,"ts_ns":%d,"table":"items","server_id":1,"gtid":"3e11fa47-71ca-11e1-9e33-c80aa9429562:9",
			"file":%q,"pos":%d,"row":%d,"thread":7,"query":null}`, tsUS/1000, tsUS, tsUS*1000, file, pos, row)
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
		{"mariadb across a failover", []string{"source.gtid", "source.file", "source.pos", "source.row"}, []string{
			mariadbSource("0-1-9", "mysql-bin.000005", 900, 0, 1), mariadbSource("0-1-10", "mysql-bin.000005", 1200, 0, 1),
			mariadbSource("0-1-10", "mysql-bin.000005", 1200, 1, 1), mariadbSource("0-1-10", "mysql-bin.000005", 1500, 0, 1),
			mariadbSource("0-2-11", "mysql-bin.000001", 330, 0, 2), mariadbSource("0-2-99", "mysql-bin.000001", 4, 0, 2),
			mariadbSource("0-2-100", "mysql-bin.000001", 12000, 0, 2), mariadbSource("0-1-101", "mysql-bin.000001", 88, 0, 1)}},
		{"mysql gtid numbers", []string{"source.gtid", "source.file", "source.pos", "source.row"}, []string{
			mysqlGTID("3e11fa47-71ca-11e1-9e33-c80aa9429562:9", 900), mysqlGTID("3e11fa47-71ca-11e1-9e33-c80aa9429562:10", 100),
			mysqlGTID("3e11fa47-71ca-11e1-9e33-c80aa9429562:1000000000000", 50)}},
		{"mysql commit times across a failover", []string{"source.ts_us", "source.file", "source.pos", "source.row"}, []string{
			mysqlCommit(1767225600000001, "mysql-bin.000007", 900, 0), mysqlCommit(1767225600000001, "mysql-bin.000007", 900, 1),
			mysqlCommit(1767225600000001, "mysql-bin.000007", 1200, 0), mysqlCommit(1767225600250000, "mysql-bin.000001", 4, 0),
			mysqlCommit(1767225601000000, "mysql-bin.000001", 380, 0)}},
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

// A GTID path reads MariaDB's "domain-server-seq" as [domain, seq] and
// MySQL's "uuid:N" as ["uuid", N]; other text is no GTID. The stream hook
// hears of a topic's second domain (or uuid) once, not of its first.
func TestGTIDComponent(t *testing.T) {
	for _, tc := range []struct{ gtid, want, stream string }{
		{"0-1-32", "[0,32]", "0"},
		{"0-2-33", "[0,33]", "0"},
		{"7-1-18446744073709551615", "", ""},
		{"3E11FA47-71CA-11E1-9E33-C80AA9429562:23", `["3E11FA47-71CA-11E1-9E33-C80AA9429562",23]`, "3E11FA47-71CA-11E1-9E33-C80AA9429562"},
		{"aae57b2f-8e44-11ee-a3d6-a036bcda1a41:test_tag:4", `["aae57b2f-8e44-11ee-a3d6-a036bcda1a41:test_tag",4]`, "aae57b2f-8e44-11ee-a3d6-a036bcda1a41:test_tag"},
		{"not-a-gtid", "", ""},
		{"uuid:1-5,uuid2:3", "", ""},
	} {
		seq, stream, ok := appendGTID(nil, tc.gtid)
		if !ok {
			seq = nil
		}
		if got := change.Seq(seq).String(); (got != tc.want && ok) || ok != (tc.want != "") || stream != tc.stream {
			t.Errorf("%s: %s stream %q, want %s stream %q", tc.gtid, got, stream, tc.want, tc.stream)
		}
	}
	d := New([]Rule{{Topic: "t", Target: "items_history", Keys: []string{"sku"}, SequenceBy: []string{"source.gtid", "source.pos"}, ValidFrom: "source.ts_ms"}}, nil, nil)
	var heard []string
	d.SetStreamHook(func(topic, stream, other string) { heard = append(heard, topic+":"+stream+" after "+other) })
	for _, g := range []string{"0-1-5", "0-2-6", "1-3-1", "0-1-7", "1-3-2", "2-1-1"} {
		v := fmt.Sprintf(`{"before":null,"after":{"sku":"X"},"source":{"connector":"mariadb","ts_ms":1767225600000,"gtid":%q,"pos":4},"op":"u"}`, g)
		if _, err := d.Decode(context.Background(), change.Origin{Partition: change.Partition{Topic: "t"}}, []byte(`{"sku":"X"}`), []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"t:1 after 0", "t:2 after 0"}; fmt.Sprint(heard) != fmt.Sprint(want) {
		t.Errorf("stream hook heard %v, want %v", heard, want)
	}
	// A snapshot read carries a null GTID: it has no sequence of its own
	// and is anchored in its partition (consumer); a change without one
	// is an error naming the path.
	read := `{"before":null,"after":{"sku":"X"},"source":{"connector":"mariadb","ts_ms":1767225600000,"snapshot":"true","gtid":null,"pos":4},"op":"r"}`
	ev, err := d.Decode(context.Background(), change.Origin{Partition: change.Partition{Topic: "t"}}, []byte(`{"sku":"X"}`), []byte(read))
	if err != nil || ev.Seq != nil {
		t.Errorf("snapshot read without a GTID: seq %v, %v; want none", ev.Seq, err)
	}
	upd := `{"before":null,"after":{"sku":"X"},"source":{"connector":"mariadb","ts_ms":1767225600000,"gtid":null,"pos":4},"op":"u"}`
	if _, err := d.Decode(context.Background(), change.Origin{Partition: change.Partition{Topic: "t"}}, []byte(`{"sku":"X"}`), []byte(upd)); err == nil ||
		!strings.Contains(err.Error(), "source.gtid") {
		t.Errorf("update without a GTID: %v; want an error naming source.gtid", err)
	}
}
