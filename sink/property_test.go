package sink_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

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
	t.Parallel()
	pool := sharedPool(t)
	n := propertySeeds(t)
	first := uint64(1)
	if s := os.Getenv("SCD2SINK_PROPERTY_SEED"); s != "" {
		v, _ := strconv.Atoi(s)
		first, n = uint64(v), 1
	}
	for seed := first; seed < first+uint64(n); seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			// Truncates fold their keys in chunks of 1 to 3 here, of
			// thousands in the service.
			runScenario(t, pool, seed, scenarioOpts{tune: func(tu *sink.Tuning) { tu.Apply.TruncateChunk = 1 + int(seed%3) }})
		})
	}
}

// TestFoldPropertyParallel is TestFoldProperty with the events spread over
// three partitions (by key; now and then a key's event in another one)
// and every batch that may be split applied in parts side by side
// (parallel.go): the history is the fold's all the same.
func TestFoldPropertyParallel(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	var splits int64
	for seed := uint64(1); seed <= uint64(max(1, propertySeeds(t)/4)); seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			splits += runScenario(t, pool, seed, scenarioOpts{parts: 3, tune: splitAll})
		})
	}
	if splits == 0 {
		t.Fatal("no batch was applied in parts")
	}
}

// TestFoldPropertyNoOverlap is TestFoldProperty with history_constraint:
// no_overlap on every table: PostgreSQL checks at each commit that no two
// versions of a key overlap, and no repair, late delete, re-create, tie,
// truncate or reconciliation ever trips it; the history is the fold's.
func TestFoldPropertyNoOverlap(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	if _, err := pool.Exec(context.Background(), "CREATE EXTENSION IF NOT EXISTS btree_gist"); err != nil {
		t.Fatalf("btree_gist (PostgreSQL's contrib): %v", err)
	}
	for seed := uint64(1); seed <= uint64(max(1, propertySeeds(t)/4)); seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			runScenario(t, pool, seed, scenarioOpts{noOverlap: true})
			var n int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_constraint c JOIN pg_namespace s ON s.oid = c.connamespace
				WHERE s.nspname = $1 AND c.contype = 'x' AND c.condeferred`, fmt.Sprintf("excl%d", seed)).Scan(&n); err != nil || n == 0 {
				t.Fatalf("no deferred exclusion constraint in the scenario's tables (%d, %v)", n, err)
			}
		})
	}
}

// TestRejectedValuesProperty is TestFoldProperty with values PostgreSQL
// rejects: acct_history is pre-created with city varchar(6) and some
// events carry a longer city. Those events, and only those, become dead
// letters, however many share a key and a batch; the history equals the
// fold of the other events.
func TestRejectedValuesProperty(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	n := propertySeeds(t) / 4
	for seed := uint64(1); seed <= uint64(n); seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			runScenario(t, pool, seed, scenarioOpts{rejects: true})
		})
	}
}

// TestFoldPropertyUncached is TestFoldProperty with no state kept
// between batches (CacheKeys -1): every key's state is read back from the
// table, as after a restart or when the cache has forgotten the key. The
// history must be the fold's all the same (the append path once resolved
// a placeholder against the version's row, not the last image, only for
// states read back).
func TestFoldPropertyUncached(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	for seed := uint64(1); seed <= uint64(max(1, propertySeeds(t)/4)); seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			runScenario(t, pool, seed, scenarioOpts{uncached: true})
		})
	}
}

// badCity is longer than the varchar(6) of TestRejectedValuesProperty.
const badCity = "Innsbruck"

// scenarioOpts are the ways a scenario runs: with values PostgreSQL
// rejects; over parts partitions (with more than one, the sinks apply
// batches in parts: Config.ApplyWorkers 2); with history tables
// partitioned by interval ("" for plain ones); each sink tuned by tune;
// sinks that keep no state between batches (uncached).
type scenarioOpts struct {
	rejects   bool
	noOverlap bool // history_constraint: no_overlap on every table
	uncached  bool
	parts     int
	interval  string
	tune      func(*sink.Tuning)
}

// runScenario runs seed's scenario and returns how many batches its
// sinks applied in parts.
func runScenario(t *testing.T, pool *pgxpool.Pool, seed uint64, o scenarioOpts) (splits int64) {
	rejects, parts, interval := o.rejects, max(1, o.parts), o.interval
	rng := rand.New(rand.NewPCG(seed, 0x5cd2))
	schema := fmt.Sprintf("prop%d", seed)
	if o.uncached {
		schema = fmt.Sprintf("unc%d", seed)
	}
	if rejects {
		schema = fmt.Sprintf("rej%d", seed)
	}
	if parts > 1 {
		schema = fmt.Sprintf("par%d", seed)
	}
	if interval != "" {
		schema = fmt.Sprintf("part%d", seed)
	}
	if o.noOverlap {
		schema = fmt.Sprintf("excl%d", seed)
	}
	if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	sc := scdtest.GenScenario(rng, schema)
	for i := range sc.Specs {
		sc.Specs[i].Partitioning = sink.Partitioning{Interval: interval, Ahead: 1}
		sc.Specs[i].NoOverlap = o.noOverlap
	}
	batches := deliver(rng, sc.Events)
	snapBatch := -1
	var snaps []sink.Snapshot
	if rng.IntN(3) == 0 {
		if before, after, sn, ok := scdtest.AddSnapshot(rng, &sc); ok {
			// Everything up to the snapshot is applied before it completes
			// (its topic applied past it); what follows, in any order.
			first := deliver(rng, before)
			batches, snapBatch, snaps = append(first, deliver(rng, after)...), len(first)-1, []sink.Snapshot{sn}
		}
	}
	model := sc.Events
	bad := map[string]bool{}
	if rejects {
		// Creates and updates only: a snapshot's read left out would be
		// closed by its reconciliation, which the fold knows too, but is
		// not what this test is about.
		mark := rand.New(rand.NewPCG(seed, 0xbad))
		if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+schema+"; CREATE TABLE "+schema+
			".acct_history (acct_id text, plan text, city varchar(6), name text, score bigint)"); err != nil {
			t.Fatal(err)
		}
		model = nil
		for _, e := range sc.Events {
			if e.Table == "acct_history" && (e.Op == change.OpCreate || e.Op == change.OpUpdate) && mark.IntN(4) == 0 {
				e.After["city"] = badCity
				bad[e.Seq.String()] = true
				continue
			}
			model = append(model, e)
		}
	}
	// Two writers take turns on one partition, as around a rebalance; each
	// must notice the other's batches (scd2sink_offsets) before trusting
	// what it remembers.
	cfg := sink.Config{Schema: schema, Tables: sc.Specs}
	if o.uncached {
		cfg.CacheKeys = -1
	}
	if parts > 1 {
		cfg.ApplyWorkers = 2
		prng := rand.New(rand.NewPCG(seed, 0x9a27))
		for _, e := range sc.Events {
			p := int32(len(e.KeyID()) % parts)
			for _, c := range e.KeyID() {
				p = (p*31 + c) % int32(parts)
			}
			if prng.IntN(20) == 0 { // a key in two partitions: its events stay in one part
				p = int32(prng.IntN(parts))
			}
			e.Origin.Partition = change.Partition{Topic: "prop", Partition: p}
		}
	}
	var all []*sink.Sink
	newOne := func() *sink.Sink {
		s := newSinkTuned(t, pool, cfg, o.tune)
		all = append(all, s)
		return s
	}
	defer func() {
		for _, s := range all {
			splits += s.SplitBatches()
		}
	}()
	sinks := []*sink.Sink{newOne(), newOne()}
	s := sinks[0]
	for i, b := range batches {
		w := 0
		if rng.IntN(5) == 0 {
			w = 1
		}
		if rng.IntN(8) == 0 { // a restart: nothing kept in memory
			sinks[w] = newOne()
		}
		s = sinks[w]
		offsets := map[change.Partition]int64{}
		for p := range parts {
			offsets[change.Partition{Topic: "prop", Partition: int32(p)}] = int64(i + 1)
		}
		batch := sink.Batch{Events: b, Positions: sink.At(offsets)}
		if i == snapBatch {
			batch.Snapshots = snaps
		}
		if _, err := s.Apply(context.Background(), batch); err != nil {
			t.Fatalf("seed %d batch %d: %v", seed, i, err)
		}
	}
	for _, spec := range sc.Specs {
		cols := sc.Cols[spec.Target]
		want := scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, model))
		got := scdtest.HistoryLines(t, pool, spec, cols)
		if d := scdtest.DiffLines(want, got); d != "" {
			t.Errorf("seed %d: %s (scope %s, deletes %s) differs from the fold:\n%s\nevents:\n%s", seed, spec.Target,
				spec.Type1Scope, spec.Deletes, d, describe(sc.Events, spec.Target))
		}
		verifyClean(t, s, spec.Target)
	}
	rows, err := pool.Query(context.Background(), "SELECT convert_from(value, 'UTF8')::jsonb->'after'->>'city', convert_from(value, 'UTF8')::jsonb->'seq', error FROM "+schema+".scd2sink_dead_letters")
	if err != nil {
		t.Fatal(err)
	}
	dead := map[string]bool{}
	for rows.Next() {
		var city *string
		var seq []string
		var msg string
		if err := rows.Scan(&city, &seq, &msg); err != nil {
			t.Fatal(err)
		}
		if city == nil || *city != badCity || len(seq) != 1 {
			t.Errorf("seed %d: a dead letter for an event PostgreSQL accepts: city %v seq %v: %s", seed, city, seq, msg)
			continue
		}
		dead["["+seq[0]+"]"] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for seq := range bad {
		if !dead[seq] {
			t.Errorf("seed %d: the rejected event at sequence %s is not a dead letter", seed, seq)
		}
	}
	return // splits: set when the sinks are counted (deferred above)
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
