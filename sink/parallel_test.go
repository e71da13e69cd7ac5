package sink_test

import (
	"context"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestSplitBatchFailure applies batches in parts where one part fails (a
// trigger raising an error for key A, partition 0) and checks what
// scd2sink_offsets then claims: partition 0's offset stays, and every
// event of a partition whose offset was recorded is in the history. A key
// with events in both partitions ties them into one part; keys apart let
// partition 1's part commit alone. The same prepared batch applied again
// afterwards gives the fold's history, and partition 1's dead letter is
// written once.
func TestSplitBatchFailure(t *testing.T) {
	t.Parallel()
	in := func(p int32, ev *change.Event) *change.Event {
		ev.Origin.Partition.Partition = p
		return ev
	}
	for _, tc := range []struct {
		name   string
		events []*change.Event
		split  bool // partition 1's part may commit alone
	}{
		{"a key in both partitions", []*change.Event{
			in(0, cust(change.OpCreate, 10, day, "A", "name", "a", "plan", "x", "city", "Wien", "visits", 1)),
			in(0, cust(change.OpCreate, 11, day, "B", "name", "b", "plan", "x", "city", "Wien", "visits", 1)),
			in(1, cust(change.OpCreate, 12, day, "C", "name", "c", "plan", "x", "city", "Wien", "visits", 1)),
			in(1, cust(change.OpUpdate, 13, day.AddDate(0, 1, 0), "B", "name", "b", "plan", "y", "city", "Wien", "visits", 2)),
			in(1, cust(change.OpCreate, 14, day, "D", "name", "d", "plan", "x", "city", "Wien", "visits", "many")),
		}, false},
		{"keys apart", []*change.Event{
			in(0, cust(change.OpCreate, 10, day, "A", "name", "a", "plan", "x", "city", "Wien", "visits", 1)),
			in(0, cust(change.OpCreate, 11, day, "B", "name", "b", "plan", "x", "city", "Wien", "visits", 1)),
			in(1, cust(change.OpCreate, 12, day, "C", "name", "c", "plan", "x", "city", "Wien", "visits", 1)),
			in(1, cust(change.OpUpdate, 13, day.AddDate(0, 1, 0), "C", "name", "c", "plan", "y", "city", "Wien", "visits", 2)),
			in(1, cust(change.OpCreate, 14, day, "D", "name", "d", "plan", "x", "city", "Wien", "visits", "many")),
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			pool := newPool(t)
			spec := custSpec("public")
			s := newSinkTuned(t, pool, sink.Config{Schema: "public", Tables: []sink.TableSpec{spec}, ApplyWorkers: 2}, splitAll)
			p0, p1 := change.Partition{Topic: "shop.public.customers", Partition: 0}, change.Partition{Topic: "shop.public.customers", Partition: 1}
			first := in(0, cust(change.OpCreate, 1, day, "Z", "name", "z", "plan", "x", "city", "Wien", "visits", 1))
			if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{first}, Positions: sink.At(map[change.Partition]int64{p0: 2})}); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `CREATE FUNCTION refuse_a() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN IF NEW.customer_id = 'A' THEN RAISE EXCEPTION 'key A refused'; END IF; RETURN NEW; END $$;
				CREATE TRIGGER refuse_a BEFORE INSERT ON customers_history FOR EACH ROW EXECUTE FUNCTION refuse_a()`); err != nil {
				t.Fatal(err)
			}
			batch := sink.Batch{Events: tc.events, Positions: sink.At(map[change.Partition]int64{p0: 100, p1: 100})}
			before := s.SplitBatches()
			prepared, err := s.Prepare(ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.ApplyPrepared(ctx, prepared); err == nil {
				t.Fatal("the batch applied despite the trigger")
			}
			if split := s.SplitBatches() > before; split != tc.split {
				t.Errorf("applied in parts: %v, want %v", split, tc.split)
			}
			var off0, off1 int64
			_ = pool.QueryRow(ctx, `SELECT coalesce(max(next_offset), 0) FROM scd2sink_offsets WHERE partition = 0`).Scan(&off0)
			_ = pool.QueryRow(ctx, `SELECT coalesce(max(next_offset), 0) FROM scd2sink_offsets WHERE partition = 1`).Scan(&off1)
			if off0 != 2 {
				t.Errorf("partition 0's offset is %d after its part failed, want 2", off0)
			}
			if tc.split != (off1 == 100) {
				t.Fatalf("partition 1's offset is %d after the failure", off1)
			}
			for _, ev := range tc.events {
				if ev.Origin.Partition.Partition != 1 || off1 < 100 {
					continue
				}
				q, arg := `SELECT count(*) FROM customers_history WHERE scd_seq = $1`, any([]byte(ev.Seq))
				if ev.Key[0] == "D" { // its visits are no number: a dead letter
					q, arg = `SELECT count(*) FROM scd2sink_dead_letters WHERE partition = 1 AND "offset" = $1`, ev.Origin.Offset
				}
				var n int
				if err := pool.QueryRow(ctx, q, arg).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					t.Errorf("partition 1's offset was recorded, but its event at sequence %s is not applied", ev.Seq)
				}
			}
			if _, err := pool.Exec(ctx, `DROP TRIGGER refuse_a ON customers_history`); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ApplyPrepared(ctx, prepared); err != nil {
				t.Fatal(err)
			}
			var dead int
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_dead_letters`).Scan(&dead)
			if dead != 1 {
				t.Errorf("%d dead letters, want 1", dead)
			}
			all := append([]*change.Event{first}, tc.events[:len(tc.events)-1]...)
			want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, all))
			got := scdtest.HistoryLines(t, pool, spec, custCols)
			if d := scdtest.DiffLines(want, got); d != "" {
				t.Errorf("history differs from the fold:\n%s", d)
			}
			verifyClean(t, s, spec.Target)
		})
	}
}
