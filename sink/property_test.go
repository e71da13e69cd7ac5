package sink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// scenario is a random source history for a few tables.
type scenario struct {
	specs  []sink.TableSpec
	cols   map[string][]string
	events []*change.Event // in source (sequence) order
}

func pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

// genScenario makes random histories: creates, tracked and Type-1-only
// updates, no-op updates, deletes, re-creates, creates while live, updates
// and deletes of unknown rows, placeholders, truncates, and equal and
// backwards timestamps, over a text-keyed and a composite-keyed table.
func genScenario(rng *rand.Rand, schema string) scenario {
	scope := pick(rng, sink.AllVersions, sink.CurrentVersion)
	deletes := pick(rng, sink.DeletesClose, sink.DeletesClose, sink.DeletesClose, sink.DeletesIgnore)
	acct := sink.TableSpec{Target: "acct_history", Schema: schema, Keys: []string{"acct_id"},
		Columns: []sink.Column{{Name: "acct_id", Type: "text"}, {Name: "plan", Type: "text"}, {Name: "city", Type: "text"},
			{Name: "name", Type: "text"}, {Name: "score", Type: "bigint"}},
		TrackHistory: []string{"plan", "city"}, Type1Scope: scope, Deletes: deletes}
	item := sink.TableSpec{Target: "item_history", Schema: schema, Keys: []string{"shop", "sku"},
		Columns: []sink.Column{{Name: "shop", Type: "bigint"}, {Name: "sku", Type: "text"}, {Name: "price", Type: "bigint"},
			{Name: "active", Type: "boolean"}},
		Type1Scope: pick(rng, sink.AllVersions, sink.CurrentVersion), Deletes: sink.DeletesClose}
	sc := scenario{specs: []sink.TableSpec{acct, item},
		cols: map[string][]string{"acct_history": {"plan", "city", "name", "score"}, "item_history": {"price", "active"}}}

	type keyState struct {
		key  []any
		live bool
		row  map[string]any
	}
	for ti, spec := range sc.specs {
		nKeys := 1 + rng.IntN(5)
		keys := make([]*keyState, nKeys)
		for i := range keys {
			if ti == 0 {
				keys[i] = &keyState{key: []any{fmt.Sprintf("A%d", i)}}
			} else {
				keys[i] = &keyState{key: []any{json.Number(strconv.Itoa(1 + i%2)), fmt.Sprintf("sku-%d", i)}}
			}
		}
		newRow := func(k *keyState) map[string]any {
			row := map[string]any{}
			if ti == 0 {
				row["acct_id"] = k.key[0]
				row["plan"] = pick[any](rng, "basic", "pro", "", nil)
				row["city"] = pick[any](rng, "Wien", "Linz", "", nil)
				row["name"] = pick[any](rng, "Sarah", "Sara", nil)
				row["score"] = pick[any](rng, json.Number("0"), json.Number("1"), json.Number("2"), nil)
			} else {
				row["shop"], row["sku"] = k.key[0], k.key[1]
				row["price"] = pick[any](rng, json.Number("100"), json.Number("120"), nil)
				row["active"] = pick[any](rng, true, false)
			}
			return row
		}
		seq := int64(rng.IntN(1000))
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		steps := 3 + rng.IntN(25)
		for step := 0; step < steps; step++ {
			seq += 1 + int64(rng.IntN(3))
			switch r := rng.IntN(100); {
			case r < 15: // same time as the previous event
			case r < 25:
				at = at.Add(-time.Duration(1+rng.IntN(30)) * time.Minute)
			default:
				at = at.Add(time.Duration(1+rng.IntN(600)) * time.Minute)
			}
			ev := &change.Event{Table: spec.Target, Seq: change.MustSeq(seq), ValidFrom: at}
			if rng.IntN(40) == 0 {
				ev.Op = change.OpTruncate
				for _, k := range keys {
					k.live = false
				}
				sc.events = append(sc.events, ev)
				continue
			}
			k := keys[rng.IntN(len(keys))]
			ev.Key = k.key
			switch r := rng.IntN(100); {
			case !k.live && r < 85, k.live && r < 8: // create (while live: a missing delete)
				ev.Op = pick(rng, change.OpCreate, change.OpCreate, change.OpRead)
				k.row, k.live = newRow(k), true
			case k.live && r < 75, !k.live && r < 92: // update, often changing little or nothing
				ev.Op = change.OpUpdate
				if k.row == nil {
					k.row = newRow(k)
				}
				next := newRow(k)
				for c, v := range next {
					if rng.IntN(3) == 0 {
						k.row[c] = v
					}
				}
				k.live = true
			default:
				ev.Op = change.OpDelete
				k.live = false
			}
			if ev.Op.HasAfter() {
				ev.After = copyMap(k.row)
				if ti == 0 && ev.Op == change.OpUpdate && rng.IntN(12) == 0 {
					ev.After[pick(rng, "name", "city")] = change.Unavailable
				}
			}
			sc.events = append(sc.events, ev)
		}
	}
	return sc
}

// deliver turns the source history into batches as Kafka and the sequencer
// might hand them over: reordered, some far late, duplicated, and with whole
// batches replayed.
func deliver(rng *rand.Rand, evs []*change.Event) [][]*change.Event {
	type arrival struct {
		at float64
		ev *change.Event
	}
	var arr []arrival
	mode := rng.IntN(3)
	for i, e := range evs {
		var at float64
		switch mode {
		case 0: // any order at all
			at = rng.Float64() * float64(len(evs))
		case 1: // nearly in order, a few events far late
			at = float64(i) + rng.ExpFloat64()*2
			if rng.IntN(10) == 0 {
				at += float64(rng.IntN(len(evs) + 1))
			}
		default: // in order
			at = float64(i)
		}
		arr = append(arr, arrival{at, e})
		if rng.IntN(8) == 0 { // redelivered later
			arr = append(arr, arrival{at + rng.Float64()*float64(len(evs)), e})
		}
	}
	sort.SliceStable(arr, func(i, j int) bool { return arr[i].at < arr[j].at })
	var batches [][]*change.Event
	for len(arr) > 0 {
		n := 1 + rng.IntN(12)
		if n > len(arr) {
			n = len(arr)
		}
		b := make([]*change.Event, n)
		for i := range b {
			b[i] = arr[i].ev
		}
		arr = arr[n:]
		batches = append(batches, b)
		if rng.IntN(10) == 0 { // the whole batch again (a crash before the commit)
			batches = append(batches, b)
		}
	}
	return batches
}

func propertySeeds(t *testing.T) int {
	t.Helper()
	if s := os.Getenv("SCD2SINK_PROPERTY_SEEDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("SCD2SINK_PROPERTY_SEEDS: %v", err)
		}
		return n
	}
	if testing.Short() {
		return 30
	}
	return 240
}

// TestFoldProperty applies random histories in random arrival orders, with
// duplicates, replayed batches and restarts, and compares every history
// table with the reference fold row by row.
func TestFoldProperty(t *testing.T) {
	pool := sharedPool(t)
	n := propertySeeds(t)
	first := uint64(1)
	if s := os.Getenv("SCD2SINK_PROPERTY_SEED"); s != "" {
		v, _ := strconv.Atoi(s)
		first, n = uint64(v), 1
	}
	for seed := first; seed < first+uint64(n); seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			runScenario(t, pool, seed)
		})
	}
}

func runScenario(t *testing.T, pool *pgxpool.Pool, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5cd2))
	schema := fmt.Sprintf("prop%d", seed)
	if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	sc := genScenario(rng, schema)
	batches := deliver(rng, sc.events)
	// Two writers take turns on one partition, as around a rebalance; each
	// must notice the other's batches (scd2sink_offsets) before trusting
	// what it remembers.
	sinks := []*sink.Sink{newSink(t, pool, schema, sc.specs...), newSink(t, pool, schema, sc.specs...)}
	s := sinks[0]
	part := change.Partition{Topic: "prop", Partition: 0}
	for i, b := range batches {
		w := 0
		if rng.IntN(5) == 0 {
			w = 1
		}
		if rng.IntN(8) == 0 { // a restart: nothing kept in memory
			sinks[w] = newSink(t, pool, schema, sc.specs...)
		}
		s = sinks[w]
		batch := sink.Batch{Events: b, Offsets: map[change.Partition]int64{part: int64(i + 1)}}
		if _, err := s.Apply(context.Background(), batch); err != nil {
			t.Fatalf("seed %d batch %d: %v", seed, i, err)
		}
	}
	for _, spec := range sc.specs {
		cols := sc.cols[spec.Target]
		want := modelLines(spec, cols, modelFold(spec, cols, sc.events))
		got := historyLines(t, pool, spec, cols)
		if d := diffLines(want, got); d != "" {
			t.Errorf("seed %d: %s (scope %s, deletes %s) differs from the fold:\n%s\nevents:\n%s", seed, spec.Target,
				spec.Type1Scope, spec.Deletes, d, describe(sc.events, spec.Target))
		}
		verifyClean(t, s, spec.Target)
	}
	var dead int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+schema+".scd2sink_dead_letters").Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Errorf("seed %d: %d dead letters for a clean history", seed, dead)
	}
}

func describe(evs []*change.Event, table string) string {
	var b strings.Builder
	for _, e := range evs {
		if e.Table != table {
			continue
		}
		fmt.Fprintf(&b, "  %s key=%v seq=%s t=%s after=%v\n", e.Op, e.Key, e.Seq, e.ValidFrom.Format("01-02T15:04"), e.After)
	}
	return b.String()
}
