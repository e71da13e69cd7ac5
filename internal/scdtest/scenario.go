package scdtest

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// Scenario is a random source history for a few tables.
type Scenario struct {
	Specs  []sink.TableSpec
	Cols   map[string][]string // the non-key columns of each target
	Events []*change.Event     // in source (sequence) order
}

// Pick returns one of xs at random.
func Pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

// GenScenario makes random histories: creates, tracked and Type-1-only
// updates, no-op updates, deletes, re-creates, creates while live, updates
// and deletes of unknown rows, placeholders, truncates, and equal and
// backwards timestamps, and columns dropped and added again at the source
// (DESIGN.md section 11), over a text-keyed and a composite-keyed table.
func GenScenario(rng *rand.Rand, schema string) Scenario {
	scope := Pick(rng, sink.AllVersions, sink.CurrentVersion)
	deletes := Pick(rng, sink.DeletesClose, sink.DeletesClose, sink.DeletesClose, sink.DeletesNewRecord, sink.DeletesNewRecord, sink.DeletesIgnore)
	acct := sink.TableSpec{Target: "acct_history", Schema: schema, Keys: []string{"acct_id"},
		Columns: []sink.Column{{Name: "acct_id", Type: "text"}, {Name: "plan", Type: "text"}, {Name: "city", Type: "text"},
			{Name: "name", Type: "text"}, {Name: "score", Type: "bigint"}},
		TrackHistory: []string{"plan", "city"}, Type1Scope: scope, Deletes: deletes}
	item := sink.TableSpec{Target: "item_history", Schema: schema, Keys: []string{"shop", "sku"},
		Columns: []sink.Column{{Name: "shop", Type: "bigint"}, {Name: "sku", Type: "text"}, {Name: "price", Type: "bigint"},
			{Name: "active", Type: "boolean"}},
		Type1Scope: Pick(rng, sink.AllVersions, sink.CurrentVersion), Deletes: sink.DeletesClose}
	sc := Scenario{Specs: []sink.TableSpec{acct, item},
		Cols: map[string][]string{"acct_history": {"plan", "city", "name", "score"}, "item_history": {"price", "active"}}}

	type keyState struct {
		key  []any
		live bool
		row  map[string]any
	}
	for ti, spec := range sc.Specs {
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
				row["plan"] = Pick[any](rng, "basic", "pro", "", nil)
				row["city"] = Pick[any](rng, "Wien", "Linz", "", nil)
				row["name"] = Pick[any](rng, "Sarah", "Sara", nil)
				row["score"] = Pick[any](rng, json.Number("0"), json.Number("1"), json.Number("2"), nil)
			} else {
				row["shop"], row["sku"] = k.key[0], k.key[1]
				row["price"] = Pick[any](rng, json.Number("100"), json.Number("120"), nil)
				row["active"] = Pick[any](rng, true, false)
			}
			return row
		}
		seq := int64(rng.IntN(1000))
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		dropped := map[string]bool{} // columns the source's schema lacks now
		readded := map[string]bool{} // dropped columns back since the last image
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
			if ti == 0 && rng.IntN(12) == 0 {
				c := Pick(rng, "city", "plan", "score")
				dropped[c] = !dropped[c]
				readded[c] = !dropped[c]
			}
			if rng.IntN(40) == 0 {
				ev.Op = change.OpTruncate
				for _, k := range keys {
					k.live = false
				}
				sc.Events = append(sc.Events, ev)
				continue
			}
			k := keys[rng.IntN(len(keys))]
			ev.Key = k.key
			switch r := rng.IntN(100); {
			case !k.live && r < 85, k.live && r < 8: // create (while live: a missing delete)
				ev.Op = Pick(rng, change.OpCreate, change.OpCreate, change.OpRead)
				k.row, k.live = newRow(k), true
			case k.live && r < 75, !k.live && r < 92: // update, often changing little or nothing
				ev.Op = change.OpUpdate
				if k.row == nil {
					k.row = newRow(k)
				}
				next := newRow(k)
				for _, c := range slices.Sorted(maps.Keys(next)) { // in a fixed order: a seed gives one history
					if rng.IntN(3) == 0 {
						k.row[c] = next[c]
					}
				}
				k.live = true
			default:
				ev.Op = change.OpDelete
				k.live = false
			}
			if ev.Op.HasAfter() {
				ev.After = CopyMap(k.row)
				if ti == 0 && ev.Op == change.OpUpdate && rng.IntN(12) == 0 {
					ev.After[Pick(rng, "name", "city")] = change.Unavailable
					if rng.IntN(3) == 0 { // two columns: lists of them must survive a rewrite
						ev.After["name"], ev.After["city"] = change.Unavailable, change.Unavailable
					}
				}
				for c, on := range dropped {
					if on {
						delete(ev.After, c)
					}
				}
				// A column back at the source, its value unchanged
				// (TOASTed): the placeholder takes the key's previous
				// image's value (NULL when that image came while the
				// column was dropped).
				for _, c := range slices.Sorted(maps.Keys(readded)) {
					if readded[c] && ev.Op == change.OpUpdate && rng.IntN(2) == 0 {
						ev.After[c] = change.Unavailable
					}
				}
				clear(readded)
			}
			sc.Events = append(sc.Events, ev)
		}
	}
	return sc
}

// BigScenario joins n random scenarios into one larger history over the same
// two tables (specs of the first), renaming each scenario's keys apart.
func BigScenario(rng *rand.Rand, schema string, n int) Scenario {
	big := GenScenario(rng, schema)
	for i := 1; i < n; i++ {
		sc := GenScenario(rng, schema)
		prefix := fmt.Sprintf("S%d-", i)
		for _, ev := range sc.Events {
			if ev.Key != nil {
				key := append([]any(nil), ev.Key...)
				switch ev.Table {
				case "acct_history":
					key[0] = prefix + key[0].(string)
					if ev.After != nil {
						ev.After["acct_id"] = key[0]
					}
				default:
					key[1] = prefix + key[1].(string)
					if ev.After != nil {
						ev.After["sku"] = key[1]
					}
				}
				ev.Key = key
			}
			if ev.Op == change.OpTruncate {
				continue // one scenario's truncate would close the others' rows
			}
			big.Events = append(big.Events, ev)
		}
	}
	return big
}
