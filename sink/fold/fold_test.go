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
// (scdtest.Fold). Each key's events are folded twice: at once, and in two
// runs split at a random event, the second from the state the first left,
// as the sink's append path does across batches; both must give the
// model's history.
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
			for _, split := range []bool{false, true} {
				got := foldLines(spec, cols, sc.Events, split, rng)
				if d := scdtest.DiffLines(want, got); d != "" {
					t.Fatalf("seed %d, %s (split %v): the fold differs from the model:\n%s", seed, spec.Target, split, d)
				}
			}
		}
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

// foldLines folds each key's events with Shape.Fold and renders the
// versions as scdtest.ModelLines renders the model's.
func foldLines(spec sink.TableSpec, cols []string, evs []*change.Event, split bool, rng *rand.Rand) []string {
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
		if split {
			at := rng.IntN(len(list) + 1)
			runs = [][]fold.Event{list[:at], list[at:]}
		}
		for _, run := range runs {
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
