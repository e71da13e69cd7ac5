package sink_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestQueuedWritesEqualCopy: real-shaped Debezium JSON (numeric,
// dates, zoned and micro timestamps, jsonb, before images, deletes and
// re-creates) over two tables, delivered in random order with
// redeliveries, applied twice: with small tables' writes queued and sent
// together as INSERTs from arrays (history.Later), and with every
// table's share written at once by COPY. Every column of the history and
// side tables, the bookkeeping included, is the same both ways.
func TestQueuedWritesEqualCopy(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	ctx := context.Background()
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x9e3))
			recs := scdtest.BenchWorkload(rng, 60, 900)
			var rules []debezium.Rule
			for _, src := range []*scdtest.Source{scdtest.BenchCustomers(), scdtest.BenchAccounts()} {
				rules = append(rules, debezium.Rule{Topic: src.Topic(), Target: src.Table + "_history",
					SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"})
			}
			d := debezium.New(rules, nil, nil)
			var evs []*change.Event
			for i, r := range recs {
				if r.Tombstone {
					continue
				}
				k, v := r.Src.Envelope(r.Change)
				o := change.Origin{Partition: change.Partition{Topic: r.Src.Topic()}, Offset: int64(i)}
				ev, err := d.Decode(ctx, o, k, v)
				if err != nil || ev == nil {
					t.Fatalf("record %d: %v", i, err)
				}
				evs = append(evs, ev)
			}
			batches := deliver(rng, evs)
			var dumps [2]string
			for i, unqueued := range []bool{false, true} {
				schema := fmt.Sprintf("queued%d_%t", seed, unqueued)
				var specs []sink.TableSpec
				for _, tbl := range []string{"customers", "accounts"} {
					specs = append(specs, sink.TableSpec{Target: tbl + "_history", Schema: schema, Keys: []string{"id"},
						TrackHistory: scdtest.BenchTracked[tbl]})
				}
				s := newSinkTuned(t, pool, sink.Config{Schema: schema, Tables: specs}, func(tu *sink.Tuning) { tu.Apply.Unqueued = unqueued })
				for j, b := range batches {
					if _, err := s.Apply(ctx, sink.Batch{Events: b}); err != nil {
						t.Fatalf("unqueued %t, batch %d: %v", unqueued, j, err)
					}
				}
				for _, tbl := range []string{"customers_history", "accounts_history", "customers_history_scd_events", "accounts_history_scd_events"} {
					var n int
					var dump string
					if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), coalesce(string_agg((to_jsonb(h) - 'scd_id')::text, E'\n' ORDER BY id, scd_seq, (to_jsonb(h) - 'scd_id')::text), '')
						FROM %s.%s h`, schema, tbl)).Scan(&n, &dump); err != nil {
						t.Fatal(err)
					}
					if n == 0 && (tbl == "customers_history" || tbl == "accounts_history") {
						t.Fatalf("%s.%s is empty", schema, tbl)
					}
					dumps[i] += fmt.Sprintf("%s (%d rows):\n%s\n", tbl, n, dump)
				}
				verifyClean(t, s, "customers_history")
				verifyClean(t, s, "accounts_history")
			}
			if d := scdtest.DiffLines(strings.Split(dumps[1], "\n"), strings.Split(dumps[0], "\n")); d != "" {
				t.Fatalf("queued writes differ from those written at once (want: at once, got: queued):\n%s", d)
			}
		})
	}
}
