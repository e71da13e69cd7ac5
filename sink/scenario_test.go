package sink_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

func date(m time.Month, d int) time.Time { return time.Date(2026, m, d, 0, 0, 0, 0, time.UTC) }

// seedEvents is the seed scenario: customers C1001–C1004 snapshotted on
// 2026-01-01, a typo in Sarah's name fixed on 2026-02-01 (Type 1), and on
// 2026-03-01 Sarah's plan change, Marko's move to Linz, Anna re-snapshotted
// unchanged and Liam new.
func seedEvents() []*change.Event {
	return []*change.Event{
		cust(change.OpRead, 100, date(1, 1), "C1001", "name", "Sara Meier", "plan", "basic", "city", "Wien", "visits", 3),
		cust(change.OpRead, 101, date(1, 1), "C1002", "name", "Marko Horvat", "plan", "pro", "city", "Graz", "visits", 5),
		cust(change.OpRead, 102, date(1, 1), "C1003", "name", "Anna Berger", "plan", "basic", "city", "Salzburg", "visits", 1),
		cust(change.OpUpdate, 200, date(2, 1), "C1001", "name", "Sarah Meier", "plan", "basic", "city", "Wien", "visits", 3),
		cust(change.OpUpdate, 300, date(3, 1), "C1001", "name", "Sarah Meier", "plan", "pro", "city", "Wien", "visits", 4),
		cust(change.OpUpdate, 301, date(3, 1), "C1002", "name", "Marko Horvat", "plan", "pro", "city", "Linz", "visits", 6),
		cust(change.OpRead, 302, date(3, 1), "C1003", "name", "Anna Berger", "plan", "basic", "city", "Salzburg", "visits", 1),
		cust(change.OpCreate, 303, date(3, 1), "C1004", "name", "Liam Novak", "plan", "basic", "city", "Wien", "visits", 0),
	}
}

// seedWant is the seed scenario's history, written out by hand.
var seedWant = []string{
	"C1001 seq=200164 [2026-01-01T00:00:00Z, 2026-03-01T00:00:00Z) current=false name=Sarah Meier plan=basic city=Wien visits=4",
	"C1001 seq=2002012c [2026-03-01T00:00:00Z, open) current=true name=Sarah Meier plan=pro city=Wien visits=4",
	"C1002 seq=200165 [2026-01-01T00:00:00Z, 2026-03-01T00:00:00Z) current=false name=Marko Horvat plan=pro city=Graz visits=6",
	"C1002 seq=2002012d [2026-03-01T00:00:00Z, open) current=true name=Marko Horvat plan=pro city=Linz visits=6",
	"C1003 seq=200166 [2026-01-01T00:00:00Z, open) current=true name=Anna Berger plan=basic city=Salzburg visits=1",
	"C1004 seq=2002012f [2026-03-01T00:00:00Z, open) current=true name=Liam Novak plan=basic city=Wien visits=0",
}

func TestSeedScenario(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	orders := map[string]func([]*change.Event) [][]*change.Event{
		"in order, one batch":   func(e []*change.Event) [][]*change.Event { return [][]*change.Event{e} },
		"in order, one by one":  oneByOne,
		"reversed, one by one":  func(e []*change.Event) [][]*change.Event { e = slices.Clone(e); slices.Reverse(e); return oneByOne(e) },
		"shuffled, twice each":  func(e []*change.Event) [][]*change.Event { return shuffled(e, 7, 2) },
		"shuffled, pairs of 2":  func(e []*change.Event) [][]*change.Event { return pairs(shuffled(e, 11, 1)) },
		"late March first":      func(e []*change.Event) [][]*change.Event { return [][]*change.Event{e[4:], e[:4]} },
		"snapshot replayed end": func(e []*change.Event) [][]*change.Event { return [][]*change.Event{e, e[:3]} },
	}
	i := 0
	for name, order := range orders {
		i++
		t.Run(name, func(t *testing.T) {
			schema := "seed" + string(rune('a'+i))
			spec := custSpec(schema)
			s := newSink(t, pool, schema, spec)
			for _, b := range order(seedEvents()) {
				apply(t, s, b...)
			}
			got := scdtest.HistoryLines(t, pool, spec, custCols)
			if d := scdtest.DiffLines(seedWant, got); d != "" {
				t.Fatalf("seed history is wrong:\n%s", d)
			}
			if d := scdtest.DiffLines(scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, seedEvents())), got); d != "" {
				t.Fatalf("differs from the reference fold:\n%s", d)
			}
			verifyClean(t, s, spec.Target)
			asOf := `SELECT plan FROM ` + schema + `.customers_history WHERE customer_id = 'C1001'
				AND valid_from <= $1 AND (valid_to IS NULL OR $1 < valid_to)`
			var plan string
			if err := pool.QueryRow(context.Background(), asOf, date(2, 15)).Scan(&plan); err != nil || plan != "basic" {
				t.Fatalf("C1001's plan on 2026-02-15: %q, %v; want basic", plan, err)
			}
		})
	}
}

func oneByOne(evs []*change.Event) [][]*change.Event {
	var out [][]*change.Event
	for _, e := range evs {
		out = append(out, []*change.Event{e})
	}
	return out
}

func shuffled(evs []*change.Event, seed uint64, copies int) [][]*change.Event {
	var all []*change.Event
	for c := 0; c < copies; c++ {
		all = append(all, evs...)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	return oneByOne(all)
}

func pairs(batches [][]*change.Event) [][]*change.Event {
	var out [][]*change.Event
	for i := 0; i < len(batches); i += 2 {
		b := batches[i]
		if i+1 < len(batches) {
			b = append(slices.Clone(b), batches[i+1]...)
		}
		out = append(out, b)
	}
	return out
}

// TestFieldNotes runs the classic SCD2 failure points, each in every arrival
// order (or many random ones), one event per batch, against the fold.
func TestFieldNotes(t *testing.T) {
	t.Parallel()
	d := func(day int, h int) time.Time { return time.Date(2026, 1, day, h, 0, 0, 0, time.UTC) }
	c, r, u, del := change.OpCreate, change.OpRead, change.OpUpdate, change.OpDelete
	type tc struct {
		name   string
		scope  sink.Type1Scope
		delete sink.DeletesMode
		evs    []*change.Event
		want   []string // optional hand-written expectation
	}
	cases := []tc{
		{name: "late delete between create and identical re-create", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(del, 2, d(2, 0), "K"),
			cust(c, 3, d(3, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-02T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200103 [2026-01-03T00:00:00Z, open) current=true name=a plan=p city=x visits=1",
		}},
		{name: "late no-op update whose Type 1 values matter", scope: sink.CurrentVersion, evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "b", "plan", "p", "city", "x", "visits", 2),
			cust(u, 3, d(3, 0), "K", "name", "b", "plan", "q", "city", "x", "visits", 2),
			cust(u, 4, d(4, 0), "K", "name", "c", "plan", "q", "city", "x", "visits", 3),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=b plan=p city=x visits=2",
			"K seq=200103 [2026-01-03T00:00:00Z, open) current=true name=c plan=q city=x visits=3",
		}},
		{name: "equal timestamps", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(1, 0), "K", "name", "a", "plan", "q", "city", "x", "visits", 1),
			cust(u, 3, d(1, 0), "K", "name", "a", "plan", "r", "city", "x", "visits", 1),
		}},
		{name: "time running backwards is clamped", evs: []*change.Event{
			cust(c, 1, d(3, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "a", "plan", "q", "city", "x", "visits", 1),
			cust(u, 3, d(4, 0), "K", "name", "a", "plan", "r", "city", "x", "visits", 1),
		}, want: []string{
			"K seq=200101 [2026-01-03T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200102 [2026-01-03T00:00:00Z, 2026-01-04T00:00:00Z) current=false name=a plan=q city=x visits=1",
			"K seq=200103 [2026-01-04T00:00:00Z, open) current=true name=a plan=r city=x visits=1",
		}},
		{name: "NULL, empty string and zero differ", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", nil, "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "a", "plan", "", "city", "x", "visits", 1),
			cust(u, 3, d(3, 0), "K", "name", "a", "plan", "0", "city", "x", "visits", 1),
			cust(u, 4, d(4, 0), "K", "name", "a", "plan", "0", "city", "x", "visits", 1),
		}},
		{name: "re-snapshot of unchanged rows opens nothing", evs: []*change.Event{
			cust(r, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(r, 2, d(2, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(r, 3, d(3, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
		}, want: []string{"K seq=200101 [2026-01-01T00:00:00Z, open) current=true name=a plan=p city=x visits=1"}},
		{name: "create while live starts a new version", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(c, 2, d(2, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(del, 3, d(3, 0), "K"),
		}},
		// deletes: new_record (dbt's hard_deletes: new_record): a delete
		// opens a version marked deleted with the closed version's values.
		{name: "new_record: late delete between create and re-create", delete: sink.DeletesNewRecord, evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "b", "plan", "p", "city", "x", "visits", 2),
			cust(del, 3, d(3, 0), "K"),
			cust(c, 4, d(5, 0), "K", "name", "a", "plan", "q", "city", "x", "visits", 1),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200103 [2026-01-03T00:00:00Z, 2026-01-05T00:00:00Z) current=false deleted name=a plan=p city=x visits=1",
			"K seq=200104 [2026-01-05T00:00:00Z, open) current=true name=a plan=q city=x visits=1",
		}},
		{name: "new_record: a delete ends the history current and marked", delete: sink.DeletesNewRecord, scope: sink.CurrentVersion, evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "b", "plan", "p", "city", "x", "visits", 2),
			cust(del, 3, d(3, 0), "K"),
			cust(del, 4, d(4, 0), "K"),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=b plan=p city=x visits=2",
			"K seq=200103 [2026-01-03T00:00:00Z, open) current=true deleted name=b plan=p city=x visits=2",
		}},
		{name: "new_record: an update after a delete, a delete of an unknown row, equal times", delete: sink.DeletesNewRecord, evs: []*change.Event{
			cust(del, 1, d(1, 0), "K"),
			cust(c, 2, d(2, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(del, 3, d(2, 0), "K"),
			cust(u, 4, d(2, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(del, 5, d(3, 0), "K"),
		}, want: []string{
			"K seq=200102 [2026-01-02T00:00:00Z, 2026-01-02T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200103 [2026-01-02T00:00:00Z, 2026-01-02T00:00:00Z) current=false deleted name=a plan=p city=x visits=1",
			"K seq=200104 [2026-01-02T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200105 [2026-01-03T00:00:00Z, open) current=true deleted name=a plan=p city=x visits=1",
		}},
		{name: "new_record: a truncate closes a version marked deleted", delete: sink.DeletesNewRecord, evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(del, 2, d(2, 0), "K"),
			{Table: "customers_history", Seq: change.MustSeq(3), Op: change.OpTruncate, ValidFrom: d(3, 0)},
			cust(c, 4, d(4, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-02T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200102 [2026-01-02T00:00:00Z, 2026-01-03T00:00:00Z) current=false deleted name=a plan=p city=x visits=1",
			"K seq=200104 [2026-01-04T00:00:00Z, open) current=true name=a plan=p city=x visits=1",
		}},
		{name: "deletes ignored keep the version open", delete: sink.DeletesIgnore, evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(del, 2, d(2, 0), "K"),
			cust(u, 3, d(3, 0), "K", "name", "a", "plan", "q", "city", "x", "visits", 1),
		}},
		{name: "delete then re-insert with changes", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(del, 2, d(2, 0), "K"),
			cust(u, 3, d(3, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(c, 4, d(4, 0), "K", "name", "a", "plan", "q", "city", "y", "visits", 1),
		}},
		{name: "unavailable placeholder keeps the previous value", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "a", "plan", "q", "city", change.Unavailable, "visits", 1),
			cust(u, 3, d(3, 0), "K", "name", "a", "plan", "q", "city", "x", "visits", 1),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-02T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200102 [2026-01-02T00:00:00Z, open) current=true name=a plan=q city=x visits=1",
		}},
		// DESIGN.md section 11: tracking is by value over the columns
		// both events carry; a drop or an add alone opens no version.
		{name: "a dropped column opens no version", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "a", "plan", "p", "visits", 2),
			cust(u, 3, d(3, 0), "K", "name", "a", "plan", "q", "visits", 3),
			cust(u, 4, d(4, 0), "K", "name", "a", "plan", "q", "visits", 4),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=a plan=p city=x visits=4",
			"K seq=200103 [2026-01-03T00:00:00Z, open) current=true name=a plan=q city=∅ visits=4",
		}},
		{name: "an added column opens no version", scope: sink.CurrentVersion, evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p"),
			cust(u, 2, d(2, 0), "K", "name", "a", "plan", "p", "city", "y", "visits", 1),
			cust(u, 3, d(3, 0), "K", "name", "b", "plan", "p", "city", "y", "visits", 2),
			cust(u, 4, d(4, 0), "K", "name", "b", "plan", "p", "city", "z", "visits", 2),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-04T00:00:00Z) current=false name=b plan=p city=y visits=2",
			"K seq=200104 [2026-01-04T00:00:00Z, open) current=true name=b plan=p city=z visits=2",
		}},
		{name: "a Type 1 column dropped is NULL in every version", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "a", "plan", "q", "city", "x"),
			cust(del, 3, d(3, 0), "K"),
			cust(c, 4, d(4, 0), "K", "name", "a", "plan", "q", "city", "x"),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-02T00:00:00Z) current=false name=a plan=p city=x visits=∅",
			"K seq=200102 [2026-01-02T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=a plan=q city=x visits=∅",
			"K seq=200104 [2026-01-04T00:00:00Z, open) current=true name=a plan=q city=x visits=∅",
		}},
		{name: "a column added back compares with the version that carried it", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "a", "plan", "p", "visits", 1),
			cust(u, 3, d(3, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 4, d(4, 0), "K", "name", "a", "plan", "p", "city", "v", "visits", 1),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-04T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200104 [2026-01-04T00:00:00Z, open) current=true name=a plan=p city=v visits=1",
		}},
		// A placeholder takes the previous event's value, and a column the
		// previous event lacked was NULL in it: not the value the version
		// kept from before the drop (TestResumeFromRestoredTarget's replay
		// once kept a version open across such a change).
		{name: "a placeholder after a dropped column is NULL, not the version's value", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "a", "plan", "p", "visits", 2),
			cust(u, 3, d(3, 0), "K", "name", "a", "plan", "p", "city", change.Unavailable, "visits", 3),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=a plan=p city=x visits=3",
			"K seq=200103 [2026-01-03T00:00:00Z, open) current=true name=a plan=p city=∅ visits=3",
		}},
		{name: "a placeholder in a re-create after a dropped column and a delete", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "a", "plan", "p", "visits", 2),
			cust(del, 3, d(3, 0), "K"),
			cust(c, 4, d(4, 0), "K", "name", "a", "plan", "p", "city", change.Unavailable, "visits", 3),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=a plan=p city=x visits=3",
			"K seq=200104 [2026-01-04T00:00:00Z, open) current=true name=a plan=p city=∅ visits=3",
		}},
		{name: "new_record: a placeholder after a dropped column and a delete", delete: sink.DeletesNewRecord, evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(u, 2, d(2, 0), "K", "name", "a", "plan", "p", "visits", 2),
			cust(del, 3, d(3, 0), "K"),
			cust(u, 4, d(4, 0), "K", "name", "a", "plan", "p", "city", change.Unavailable, "visits", 3),
		}},
		// A repair that would start at a version marked deleted starts
		// at the version before it: the placeholders after the delete
		// resolve against that version's last image, not against none.
		{name: "new_record: a late event after a placeholder that followed a delete", delete: sink.DeletesNewRecord, evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(del, 2, d(2, 0), "K"),
			cust(u, 3, d(3, 0), "K", "name", "b", "plan", "q", "city", change.Unavailable, "visits", 1),
			cust(u, 5, d(5, 0), "K", "name", "c", "plan", "q", "city", "x", "visits", 2),
			cust(u, 4, d(4, 0), "K", "name", "b", "plan", "q", "city", "x", "visits", 1),
		}},
		// A truncate moves a key's time only where it closes a version:
		// a late delete before it gives a later create its own time back
		// (kept in scd_raw_t when clamping raised it).
		{name: "a late delete before a truncate unclamps a later create", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			cust(del, 2, d(2, 0), "K"),
			{Table: "customers_history", Seq: change.MustSeq(3), Op: change.OpTruncate, ValidFrom: d(5, 0)},
			cust(c, 4, d(4, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-02T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200104 [2026-01-04T00:00:00Z, open) current=true name=a plan=p city=x visits=1",
		}},
		{name: "truncate closes, a late event before it is closed too", evs: []*change.Event{
			cust(c, 1, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			{Table: "customers_history", Seq: change.MustSeq(3), Op: change.OpTruncate, ValidFrom: d(3, 0)},
			cust(c, 2, d(2, 0), "L", "name", "b", "plan", "p", "city", "x", "visits", 1),
			cust(c, 4, d(4, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
		}, want: []string{
			"K seq=200101 [2026-01-01T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200104 [2026-01-04T00:00:00Z, open) current=true name=a plan=p city=x visits=1",
			"L seq=200102 [2026-01-02T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=b plan=p city=x visits=1",
		}},
		// At one sequence a key's event comes before a truncate (the
		// fold's stable order): the version it opens is closed by the
		// truncate, and later events of the key are clamped to its time,
		// whichever arrives first (three members once wrote it open).
		{name: "a truncate at a key event's own sequence closes what it opened", evs: []*change.Event{
			cust(u, 3, d(1, 0), "K", "name", "a", "plan", "p", "city", "x", "visits", 1),
			{Table: "customers_history", Seq: change.MustSeq(3), Op: change.OpTruncate, ValidFrom: d(3, 0)},
			cust(u, 4, d(2, 0), "K", "name", "a", "plan", "q", "city", "x", "visits", 1),
			cust(del, 5, d(4, 0), "K"),
		}, want: []string{
			"K seq=200103 [2026-01-01T00:00:00Z, 2026-01-03T00:00:00Z) current=false name=a plan=p city=x visits=1",
			"K seq=200104 [2026-01-03T00:00:00Z, 2026-01-04T00:00:00Z) current=false name=a plan=q city=x visits=1",
		}},
	}
	pool := newPool(t)
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			orders := permutations(len(c.evs), 24, uint64(ci))
			schema := "fn" + itoa(ci)
			for oi, order := range orders {
				if oi > 0 {
					emptySchema(t, pool, schema) // the tables stay: no DDL per order
				}
				spec := custSpec(schema)
				spec.Type1Scope, spec.Deletes = c.scope, c.delete
				s := newSink(t, pool, schema, spec)
				var arrived []string
				for _, i := range order {
					apply(t, s, c.evs[i])
					arrived = append(arrived, c.evs[i].Seq.String())
				}
				s2 := newSink(t, pool, schema, spec) // a restart replays everything
				apply(t, s2, c.evs...)
				got := scdtest.HistoryLines(t, pool, spec, custCols)
				if oi == 0 {
					// The same arrival with a restart before every event:
					// each key's state read back from the table, none
					// remembered.
					rs := spec
					rs.Schema = schema + "r"
					for _, i := range order {
						apply(t, newSink(t, pool, rs.Schema, rs), c.evs[i])
					}
					if dd := scdtest.DiffLines(got, scdtest.HistoryLines(t, pool, rs, custCols)); dd != "" {
						t.Fatalf("arrival %v with a restart before each event: differs from the arrival without:\n%s", arrived, dd)
					}
				}
				norm := spec
				if norm.Type1Scope == "" {
					norm.Type1Scope = sink.AllVersions
				}
				want := scdtest.ModelLines(norm, custCols, scdtest.Fold(norm, custCols, c.evs))
				if dd := scdtest.DiffLines(want, got); dd != "" {
					t.Fatalf("arrival %v: differs from the fold:\n%s", arrived, dd)
				}
				if c.want != nil {
					if dd := scdtest.DiffLines(c.want, got); dd != "" {
						t.Fatalf("arrival %v: differs from the expected history:\n%s", arrived, dd)
					}
				}
				verifyClean(t, s, spec.Target)
			}
		})
	}
}

// permutations returns every order of n items when there are at most max,
// else max random ones (the identity and the reverse among them).
func permutations(n, max int, seed uint64) [][]int {
	id := make([]int, n)
	for i := range id {
		id[i] = i
	}
	var all [][]int
	var rec func(p []int, k int)
	rec = func(p []int, k int) {
		if k == len(p) {
			all = append(all, slices.Clone(p))
			return
		}
		for i := k; i < len(p); i++ {
			p[k], p[i] = p[i], p[k]
			rec(p, k+1)
			p[k], p[i] = p[i], p[k]
		}
	}
	if n <= 4 {
		rec(id, 0)
		return all
	}
	rng := rand.New(rand.NewPCG(seed, 3))
	rev := slices.Clone(id)
	slices.Reverse(rev)
	all = [][]int{id, rev}
	for len(all) < max {
		p := slices.Clone(id)
		rng.Shuffle(n, func(i, j int) { p[i], p[j] = p[j], p[i] })
		all = append(all, p)
	}
	return all
}
