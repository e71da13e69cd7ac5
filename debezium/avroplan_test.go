package debezium_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
)

// TestAvroPlanMatchesGoavro: Avro envelopes of every column type
// (values, NULLs, Debezium's unavailable-value placeholders), with before
// images or without, creates, updates, deletes and snapshot reads, and
// rules that take valid_from, the sequence or a key column from the
// images, decode to
// the same events through the envelope plan as through goavro's maps.
func TestAvroPlanMatchesGoavro(t *testing.T) {
	typed := typedSource()
	full, nulls := scdtest.Row{}, scdtest.Row{"id": 2}
	for _, c := range typeCases {
		full[c.col] = c.value
	}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	typedChanges := []scdtest.Change{
		{Op: "r", After: full, LSN: 100, Commit: at, Snapshot: "true", TxID: 1},
		{Op: "r", After: nulls, LSN: 100, Commit: at, Snapshot: "last", TxID: 1},
		{Op: "u", Before: nulls, After: full, LSN: 200, PrevLSN: 150, Commit: at.Add(time.Second), TxID: 2},
		{Op: "d", Before: full, LSN: 300, Commit: at.Add(2 * time.Second), TxID: 3},
		{Op: "c", After: nulls, LSN: 400, Commit: at.Add(3 * time.Second), TxID: 4},
	}
	cust := customers()
	var custChanges []scdtest.Change
	for i := range 30 {
		c := scdtest.Change{Op: "u", After: customerRow(i), LSN: int64(24023928 + 56*i), PrevLSN: int64(24023900 + 56*i),
			TxID: int64(700 + i), Commit: at.Add(time.Duration(i) * time.Millisecond)}
		switch i % 4 {
		case 0:
			c.Op, c.Snapshot, c.PrevLSN = "r", "true", 0
		case 2:
			c.Before = customerRow(i - 1)
			c.Before["id"] = i
		case 3:
			c.Op, c.Before, c.After = "d", customerRow(i), nil
		}
		custChanges = append(custChanges, c)
	}
	rules := []struct {
		name      string
		validFrom string
		sequence  []string
		src       *scdtest.Source
		changes   []scdtest.Change
		keys      []string
	}{
		{"typed, source time", "source.ts_ms", []string{"source.lsn"}, typed, typedChanges, nil},
		{"customers, source time", "source.ts_ms", []string{"source.lsn"}, cust, custChanges, nil},
		{"customers, time from the image", "after.signed_up", []string{"source.lsn"}, cust, custChanges, nil},
		{"customers, sequence from the image", "source.ts_ms", []string{"after.id", "source.lsn"}, cust, custChanges, nil},
		// A key column the message key does not hold: taken from the
		// images, deletes' before included.
		{"customers, key from the images", "source.ts_ms", []string{"source.lsn"}, cust, custChanges, []string{"id", "email"}},
	}
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			decode := func(whole bool) ([]*change.Event, []error) {
				restore := debezium.SetAvroWhole(whole)
				defer restore()
				d := debezium.New([]debezium.Rule{{Topic: r.src.Topic(), Target: "t_history", Format: debezium.FormatAvro,
					SequenceBy: r.sequence, ValidFrom: r.validFrom, Keys: r.keys}}, avroRegistry(t, r.src), nil)
				var evs []*change.Event
				var errs []error
				for i, c := range r.changes {
					k, v := r.src.AvroEnvelope(c, 1, 2)
					ev, err := d.Decode(context.Background(), change.Origin{Partition: change.Partition{Topic: r.src.Topic()}, Offset: int64(i)}, k, v)
					evs, errs = append(evs, ev), append(errs, err)
				}
				return evs, errs
			}
			planned, perrs := decode(false)
			whole, werrs := decode(true)
			for i := range r.changes {
				if fmt.Sprint(perrs[i]) != fmt.Sprint(werrs[i]) {
					t.Fatalf("change %d: the plan says %v, goavro's maps %v", i, perrs[i], werrs[i])
				}
				if perrs[i] != nil {
					continue
				}
				if got, want := eventView(planned[i]), eventView(whole[i]); !reflect.DeepEqual(got, want) {
					t.Fatalf("change %d (%s):\n plan   %#v\n goavro %#v", i, r.changes[i].Op, got, want)
				}
			}
		})
	}
}

// imageOf is an event's row image as a map.
func imageOf(ev *change.Event) map[string]any {
	m, _ := ev.DecodeAfter()
	return m
}

// eventView is what the sink reads of an event.
func eventView(ev *change.Event) map[string]any {
	return map[string]any{"op": ev.Op, "seq": ev.Seq.String(), "valid": ev.ValidFrom, "standIn": ev.TimeStandIn, "key": ev.Key,
		"keyNames": ev.KeyNames, "source": ev.Source, "snapEnd": ev.SnapshotEnd, "after": imageOf(ev), "hash": ev.Hash(),
		"complete": ev.Complete}
}
