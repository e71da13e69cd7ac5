package fold_test

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/scd2sink/scd2sink/sink/fold"
)

// TestFoldMatchesModel folds random histories (scdtest.GenScenario:
// tracked and Type-1-only changes, no-ops, deletes, re-creates, creates
// while live, placeholders, truncates, equal and backwards times, columns
// dropped and added again at the source) with Shape.Fold, in memory, and
// compares the versions with the reference fold of DESIGN.md section 5
// (scdtest.Fold). Each key's events are folded at once; in two runs split
// at a random event, the second from the state the first left; and in two
// runs split at every event, the second from the fold.Latest the append
// path keeps between batches. All must give the model's history.
func TestFoldMatchesModel(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 32))
		sc := scdtest.GenScenario(rng, "public")
		for _, spec := range sc.Specs {
			cols := sc.Cols[spec.Target]
			want := scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, sc.Events))
			for _, split := range []splitMode{whole, splitState} {
				got := foldLines(spec, cols, sc.Events, split, func(n int) int { return rng.IntN(n + 1) })
				if d := scdtest.DiffLines(want, got); d != "" {
					t.Fatalf("seed %d, %s (%s): the fold differs from the model:\n%s", seed, spec.Target, split, d)
				}
			}
			// From a Latest, at every point: the state a batch leaves
			// matters most where the events around it are rare.
			for at := 0; ; at++ {
				longest := 0
				got := foldLines(spec, cols, sc.Events, splitLatest, func(n int) int { longest = max(longest, n); return min(at, n) })
				if d := scdtest.DiffLines(want, got); d != "" {
					t.Fatalf("seed %d, %s (%s after %d events): the fold differs from the model:\n%s", seed, spec.Target, splitLatest, at, d)
				}
				if at >= longest {
					break
				}
			}
		}
	}
}

// TestFoldFromLatest: a Debezium placeholder takes the previous after
// image's value, and a column that image lacked (dropped at the source)
// was NULL in it, not the value the version kept from before the drop.
// Folded in two runs, the second from a fold.Latest, at every split.
// Random histories rarely hold this (TestFoldMatchesModel): the column
// must come back carrying a placeholder right after an event without it.
func TestFoldFromLatest(t *testing.T) {
	at := func(h int) time.Time { return time.Date(2026, 1, 1, h, 0, 0, 0, time.UTC) }
	ev := func(op change.Op, seq int64, h int, kv ...any) *change.Event {
		e := &change.Event{Table: "acct", Key: []any{"K"}, Seq: change.MustSeq(seq), Op: op, ValidFrom: at(h)}
		if op.HasAfter() {
			e.After = map[string]any{"id": "K"}
			for i := 0; i+1 < len(kv); i += 2 {
				e.After[kv[i].(string)] = kv[i+1]
			}
		}
		return e
	}
	c, u, d := change.OpCreate, change.OpUpdate, change.OpDelete
	na := change.Unavailable
	cols := []string{"plan", "city", "name"}
	for _, tc := range []struct {
		name    string
		deletes sink.DeletesMode
		evs     []*change.Event
	}{
		{"update", sink.DeletesClose, []*change.Event{
			ev(c, 1, 1, "plan", "p", "city", "Linz", "name", "a"),
			ev(u, 2, 2, "plan", "p", "name", "b"),
			ev(u, 3, 3, "plan", "p", "city", na, "name", "c"),
		}},
		{"re-create after a delete", sink.DeletesClose, []*change.Event{
			ev(c, 1, 1, "plan", "p", "city", "Linz", "name", "a"),
			ev(u, 2, 2, "plan", "p", "name", "b"),
			ev(d, 3, 3),
			ev(c, 4, 4, "plan", "p", "city", na, "name", "c"),
		}},
		{"update after a version marked deleted", sink.DeletesNewRecord, []*change.Event{
			ev(c, 1, 1, "plan", "p", "city", "Linz", "name", "a"),
			ev(u, 2, 2, "plan", "p", "name", "b"),
			ev(d, 3, 3),
			ev(u, 4, 4, "plan", "p", "city", na, "name", "c"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, scope := range []sink.Type1Scope{sink.AllVersions, sink.CurrentVersion} {
				spec := sink.TableSpec{Target: "acct", Keys: []string{"id"}, TrackHistory: []string{"plan", "city"}, Type1Scope: scope, Deletes: tc.deletes}
				want := scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, tc.evs))
				for split := range len(tc.evs) + 1 {
					got := foldLines(spec, cols, tc.evs, splitLatest, func(int) int { return split })
					if d := scdtest.DiffLines(want, got); d != "" {
						t.Fatalf("%s, after %d events: the fold differs from the model:\n%s", scope, split, d)
					}
				}
			}
		})
	}
}

// shapeOf lays out a row as the sink's table would: the key columns, then
// cols; tracked are spec.TrackHistory (all non-key columns when empty).
func shapeOf(spec sink.TableSpec, cols []string) fold.Shape {
	sh := fold.Shape{Index: map[string]int{}, Deletes: spec.Deletes, Type1Scope: spec.Type1Scope}
	sh.Names = append(append(sh.Names, spec.Keys...), cols...)
	for i, n := range sh.Names {
		sh.Index[n] = i
		switch {
		case slices.Contains(spec.Keys, n):
		case len(spec.TrackHistory) == 0 || slices.Contains(spec.TrackHistory, n):
			sh.Tracked = append(sh.Tracked, i)
		default:
			sh.Type1 = append(sh.Type1, i)
		}
	}
	return sh
}

// splitMode says how foldLines folds a key's events.
type splitMode string

const (
	whole      splitMode = "in one run"
	splitState splitMode = "in two runs, the state kept"
	// splitLatest folds in two runs and starts the second from what the
	// append path keeps of a key between batches, a fold.Latest: the
	// latest version, and the columns the last after image lacked.
	splitLatest splitMode = "in two runs, the second from a Latest"
)

// foldLines folds each key's events with Shape.Fold and renders the
// versions as scdtest.ModelLines renders the model's.
// splitAt(n) says after how many of a key's n events the second run
// starts.
func foldLines(spec sink.TableSpec, cols []string, evs []*change.Event, split splitMode, splitAt func(n int) int) []string {
	sh := shapeOf(spec, cols)
	byKey := map[string][]fold.Event{}
	keys := map[string][]any{}
	var truncs []fold.Event
	for _, e := range evs {
		if e.Table != spec.Target {
			continue
		}
		fe := fold.Event{Seq: e.Seq, Op: e.Op, T: e.ValidFrom}
		if e.Op == change.OpTruncate {
			truncs = append(truncs, fe)
			continue
		}
		if e.Op.HasAfter() {
			fe.Row = make([]any, len(sh.Names))
			for i, n := range sh.Names {
				if k := slices.Index(spec.Keys, n); k >= 0 {
					fe.Row[i] = e.Key[k]
					continue
				}
				v, ok := e.After[n]
				switch {
				case !ok:
					fe.Absent = append(fe.Absent, n)
				case v == change.Unavailable:
					fe.Row[i] = change.UnavailableValue{}
					fe.Unavail = append(fe.Unavail, n)
				default:
					fe.Row[i] = v
				}
			}
		}
		id := e.KeyID()
		keys[id] = e.Key
		byKey[id] = append(byKey[id], fe)
	}
	var out []string
	for id, list := range byKey {
		list = append(list, truncs...)
		slices.SortStableFunc(list, func(a, b fold.Event) int { return a.Seq.Compare(b.Seq) })
		var st fold.State
		var versions []*fold.Version
		runs := [][]fold.Event{list}
		if split != whole {
			at := splitAt(len(list))
			runs = [][]fold.Event{list[:at], list[at:]}
		}
		var l fold.Latest
		for i, run := range runs {
			if i > 0 && split == splitLatest {
				l.V = st.Live
				if l.V == nil && len(versions) > 0 {
					l.V = versions[len(versions)-1]
				}
				st = fold.State{Live: st.Live, PrevT: st.PrevT, HasPrev: st.HasPrev, PrevRow: l.PrevImage(&sh, nil)}
			}
			l.PrevAbsent, l.PrevKnown = fold.LastImage(run, l.PrevAbsent, l.PrevKnown)
			o := sh.Fold(&st, run)
			for _, v := range o.Versions {
				if !slices.Contains(versions, v) {
					versions = append(versions, v)
				}
			}
		}
		if spec.Type1Scope == sink.AllVersions {
			sh.SpreadType1(versions, st.PrevRow)
		}
		for _, v := range versions {
			out = append(out, line(spec, cols, sh, keys[id], v))
		}
	}
	slices.Sort(out)
	return out
}

// line renders v as scdtest.ModelLines renders a version of the model.
func line(spec sink.TableSpec, cols []string, sh fold.Shape, key []any, v *fold.Version) string {
	var ks, vals []string
	for _, k := range key {
		ks = append(ks, text(k))
	}
	for _, c := range cols {
		vals = append(vals, c+"="+text(v.Row[sh.Index[c]]))
	}
	to := "open"
	if v.Closed {
		to = v.To.UTC().Format(time.RFC3339Nano)
	}
	deleted := ""
	if v.Deleted() {
		deleted = " deleted"
	}
	return fmt.Sprintf("%s seq=%s [%s, %s) current=%v%s %s", strings.Join(ks, "|"), hex.EncodeToString(v.Seq),
		v.From.UTC().Format(time.RFC3339Nano), to, !v.Closed, deleted, strings.Join(vals, " "))
}

func text(v any) string {
	switch x := v.(type) {
	case nil:
		return "∅"
	case string:
		return x
	case json.Number:
		return x.String()
	default:
		return fmt.Sprint(x)
	}
}

// TestValuesEqual: exact comparison, as tracked(e) != tracked(live) means
// in DESIGN.md section 5: NULL differs from the empty string and from 0,
// numbers compare by value, and a placeholder is no value.
func TestValuesEqual(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b any
		want bool
	}{
		{"null and empty string", nil, "", false},
		{"null and zero", nil, int64(0), false},
		{"empty string and zero", "", int64(0), false},
		{"equal strings", "Wien", "Wien", true},
		{"json numbers of one value", json.Number("1.50"), json.Number("1.5"), true},
		{"json numbers of two values", json.Number("1"), json.Number("2"), false},
		{"times of one instant in two zones", time.Unix(10, 0).UTC(), time.Unix(10, 0).In(time.FixedZone("x", 3600)), true},
		{"placeholder and null", change.UnavailableValue{}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fold.ValuesEqual(tc.a, tc.b); got != tc.want {
				t.Fatalf("ValuesEqual(%#v, %#v) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
		})
	}
}
