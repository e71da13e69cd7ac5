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

// valid_from: after.<column> takes a row's own time (finer than a
// connector's whole-second source.ts_ms); a delete, which has no after
// image, takes source.ts_ms instead of being dead-lettered. In JSON with
// schemas, in Avro, and in MongoDB documents.
func TestValidFromColumn(t *testing.T) {
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []scdtest.Col{{Name: "id", Schema: `{"type":"int32","optional":false}`},
			{Name: "updated_at", Schema: `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1}`}}}
	reg := srfake.New()
	t.Cleanup(reg.Close)
	reg.SeedSchema(src.Topic()+"-value", 1, 7, sr.Schema{Schema: src.AvroValueSchema(), Type: sr.TypeAvro})
	cl, err := sr.NewClient(sr.URLs(reg.URL()))
	if err != nil {
		t.Fatal(err)
	}
	commit := time.Date(2026, 3, 1, 10, 0, 1, 0, time.UTC)
	rowTime := time.Date(2026, 3, 1, 10, 0, 0, 654321000, time.UTC)
	row := scdtest.Row{"id": 1, "updated_at": rowTime.UnixMicro()}
	for _, format := range []string{FormatJSON, FormatAvro} {
		d := New([]Rule{{Topic: src.Topic(), Target: "customers_history", Format: format,
			SequenceBy: []string{"source.lsn"}, ValidFrom: "after.updated_at"}}, cl, nil)
		o := change.Origin{Partition: change.Partition{Topic: src.Topic()}}
		for _, c := range []struct {
			op         string
			before     scdtest.Row
			after      scdtest.Row
			want, what string
		}{
			{"c", nil, row, rowTime.String(), "the row's time"},
			{"d", row, nil, commit.String(), "source.ts_ms"},
		} {
			ch := scdtest.Change{Op: c.op, Before: c.before, After: c.after, LSN: 10, Commit: commit}
			k, v := src.Envelope(ch)
			if format == FormatAvro {
				k, v = src.AvroEnvelope(ch, 7, 0)
			}
			ev, err := d.Decode(context.Background(), o, k, v)
			if err != nil {
				t.Fatalf("%s %s: %v", format, c.op, err)
			}
			if got := ev.ValidFrom.UTC().String(); got != c.want {
				t.Errorf("%s %s: valid from %s, want %s (%s)", format, c.op, got, c.want, c.what)
			}
			if ev.TimeStandIn != (c.op == "d") {
				t.Errorf("%s %s: TimeStandIn %v", format, c.op, ev.TimeStandIn)
			}
		}
	}

	t.Run("mongodb", func(t *testing.T) {
		m := &scdtest.Source{Server: "app", DB: "shop", Table: "customers"}
		topic := m.ConnectorTopic("mongodb")
		d := New([]Rule{{Topic: topic, Target: "customers_history", SequenceBy: []string{"source.ts_ms", "source.ord"}, ValidFrom: "after.changed"}}, nil, nil)
		o := change.Origin{Partition: change.Partition{Topic: topic}}
		for _, c := range []struct {
			ch   scdtest.MongoChange
			want time.Time
		}{
			{scdtest.MongoChange{Op: "c", ID: "1", After: `{"_id" : 1, "changed" : {"$date" : 1772359200654}}`, At: commit, Ord: 1}, time.UnixMilli(1772359200654)},
			{scdtest.MongoChange{Op: "d", ID: "1", At: commit, Ord: 2}, commit},
		} {
			k, v := m.MongoEnvelope(c.ch)
			ev, err := d.Decode(context.Background(), o, k, v)
			if err != nil {
				t.Fatalf("%s: %v", c.ch.Op, err)
			}
			if !ev.ValidFrom.Equal(c.want) {
				t.Errorf("%s: valid from %s, want %s", c.ch.Op, ev.ValidFrom, c.want)
			}
		}
		k, v := m.MongoEnvelope(scdtest.MongoChange{Op: "c", ID: "2", After: `{"_id" : 2, "changed" : "yesterday"}`, At: commit, Ord: 3})
		if _, err := d.Decode(context.Background(), o, k, v); err == nil {
			t.Error("a text field as valid_from: no error")
		}
	})
}
