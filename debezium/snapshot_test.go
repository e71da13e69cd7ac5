package debezium

import (
	"context"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// TestSnapshotEnd: the last read of a full snapshot (last,
// last_in_data_collection) is marked, in JSON and Avro; other reads, an
// incremental snapshot's and changes are not.
func TestSnapshotEnd(t *testing.T) {
	src := avroSource()
	reg := srfake.New()
	defer reg.Close()
	reg.SeedSchema(src.Topic()+"-value", 1, 7, sr.Schema{Schema: src.AvroValueSchema(), Type: sr.TypeAvro})
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	rules := func(f string) []Rule {
		return []Rule{{Topic: src.Topic(), Target: "customers_history", Format: f, SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}
	}
	jsonDec, avroDec := New(rules(FormatJSON), nil, nil), New(rules(FormatAvro), cl, nil)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		op, snapshot string
		want         bool
	}{
		{"r", "first", false},
		{"r", "true", false},
		{"r", "last_in_data_collection", true},
		{"r", "last", true},
		{"r", "incremental", false},
		{"c", "false", false},
	}
	for _, tc := range tests {
		t.Run(tc.op+" "+tc.snapshot, func(t *testing.T) {
			c := scdtest.Change{Op: tc.op, After: scdtest.Row{"id": 1, "plan": "pro"}, LSN: 10, Commit: at, Snapshot: tc.snapshot}
			o := change.Origin{Partition: change.Partition{Topic: src.Topic()}}
			jk, jv := src.Envelope(c)
			ak, av := src.AvroEnvelope(c, 7, 0)
			for name, d := range map[string]struct {
				dec  *Decoder
				k, v []byte
			}{"json": {jsonDec, jk, jv}, "avro": {avroDec, ak, av}} {
				ev, err := d.dec.Decode(context.Background(), o, d.k, d.v)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if ev.SnapshotEnd != tc.want {
					t.Fatalf("%s: SnapshotEnd %v, want %v", name, ev.SnapshotEnd, tc.want)
				}
			}
		})
	}
}
