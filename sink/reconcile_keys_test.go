package sink_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestReconcileKeysOfEveryType: a snapshot reconciliation closes the keys
// it did not read whatever their type — bytea, timestamptz, numeric, uuid
// and a composite key of several — reading them as the table's type, never
// through text: a bytea key read as its \x… text would close a phantom
// key, a timestamptz key's text (+00) would not parse back.
func TestReconcileKeysOfEveryType(t *testing.T) {
	t.Parallel()
	ts := func(h int) time.Time { return time.Date(2026, 3, 1, h, 0, 0, 123456000, time.UTC) }
	num := func(s string) pgtype.Numeric {
		var n pgtype.Numeric
		if err := n.Scan(s); err != nil {
			t.Fatal(err)
		}
		return n
	}
	cases := []struct {
		name string
		cols []sink.Column // key columns
		keys [][]any       // four keys: the snapshot reads the first two
	}{
		{"bytea", []sink.Column{{Name: "k", Type: "bytea"}}, [][]any{{[]byte{0, 1}}, {[]byte("\\x")}, {[]byte{0xff, 0}}, {[]byte("a'b")}}},
		{"timestamptz", []sink.Column{{Name: "k", Type: "timestamptz"}}, [][]any{{ts(1)}, {ts(2)}, {ts(3)}, {ts(4)}}},
		{"numeric", []sink.Column{{Name: "k", Type: "numeric(20,4)"}}, [][]any{{num("1.5000")}, {num("-2")}, {num("12345678901234.0001")}, {num("0.0001")}}},
		{"uuid", []sink.Column{{Name: "k", Type: "uuid"}}, [][]any{{"0b7d5a3e-0000-4000-8000-000000000001"}, {"0b7d5a3e-0000-4000-8000-000000000002"},
			{"0b7d5a3e-0000-4000-8000-000000000003"}, {"0b7d5a3e-0000-4000-8000-000000000004"}}},
		{"composite", []sink.Column{{Name: "a", Type: "bytea"}, {Name: "b", Type: "timestamptz"}, {Name: "c", Type: "uuid"}, {Name: "d", Type: "text"}},
			[][]any{{[]byte{1}, ts(1), "0b7d5a3e-0000-4000-8000-000000000001", "x"}, {[]byte{1}, ts(2), "0b7d5a3e-0000-4000-8000-000000000001", "x"},
				{[]byte{2}, ts(1), "0b7d5a3e-0000-4000-8000-000000000001", "x"}, {[]byte{1}, ts(1), "0b7d5a3e-0000-4000-8000-000000000002", "y'z"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pool := newPool(t)
			ctx := context.Background()
			var keyNames []string
			for _, c := range tc.cols {
				keyNames = append(keyNames, c.Name)
			}
			spec := sink.TableSpec{Target: "typed_history", Schema: "public", Keys: keyNames, SnapshotDeletes: true,
				Columns: append(append([]sink.Column(nil), tc.cols...), sink.Column{Name: "plan", Type: "text"})}
			s := newSink(t, pool, "public", spec)
			p0 := change.Partition{Topic: "shop.public.typed", Partition: 0}
			ev := func(op change.Op, seq int64, key []any, end bool) *change.Event {
				e := &change.Event{Table: spec.Target, Key: key, Seq: change.MustSeq(seq), Op: op, ValidFrom: day.Add(time.Duration(seq) * time.Minute),
					Origin: change.Origin{Partition: p0, Offset: seq}, SnapshotEnd: end, After: map[string]any{"plan": "basic"}}
				for i, n := range keyNames {
					e.After[n] = key[i]
				}
				return e
			}
			var creates []*change.Event
			for i, k := range tc.keys {
				creates = append(creates, ev(change.OpCreate, int64(10+i), k, false))
			}
			if _, err := s.Apply(ctx, sink.Batch{Events: creates, Positions: sink.At(map[change.Partition]int64{p0: 4})}); err != nil {
				t.Fatal(err)
			}
			snap := sink.Snapshot{Target: spec.Target, Seq: change.MustSeq(100), At: day.Add(100 * time.Minute), Topic: p0.Topic, Until: map[int32]int64{0: 6}}
			reads := []*change.Event{ev(change.OpRead, 100, tc.keys[0], false), ev(change.OpRead, 100, tc.keys[1], true)}
			if _, err := s.Apply(ctx, sink.Batch{Events: reads, Positions: sink.At(map[change.Partition]int64{p0: 6}), Snapshots: []sink.Snapshot{snap}}); err != nil {
				t.Fatal(err)
			}
			var versions, current, closedAtSnap, dead int
			var errs string
			if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE is_current),
				count(*) FILTER (WHERE valid_to = $1) FROM typed_history`, snap.At).Scan(&versions, &current, &closedAtSnap); err != nil {
				t.Fatal(err)
			}
			if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(string_agg(error, '; '), '') FROM scd2sink_dead_letters`).Scan(&dead, &errs); err != nil {
				t.Fatal(err)
			}
			var done bool
			if err := pool.QueryRow(ctx, `SELECT done_at IS NOT NULL FROM scd2sink_snapshots`).Scan(&done); err != nil {
				t.Fatal(err)
			}
			// Four creates; the two read are unchanged (same values), the
			// two unread closed at the snapshot; nothing else.
			if versions != 4 || current != 2 || closedAtSnap != 2 || dead != 0 || !done {
				t.Fatalf("%d versions, %d current, %d closed at the snapshot, %d dead letters (%s), done %v; want 4, 2, 2, 0, true",
					versions, current, closedAtSnap, dead, errs, done)
			}
			verifyClean(t, s, spec.Target)
		})
	}
}

// TestReconciliationChunksFence: a reconciliation commits its deletes a
// chunk at a time; another writer applying between two chunks, from a
// cache that remembers a key the first chunk closed, must forget it (the
// chunk's transaction fences), so that its later change opens a version
// as the fold says instead of writing into the closed one.
func TestReconciliationChunksFence(t *testing.T) {
	t.Parallel()
	for _, scope := range []string{"all_versions", "current_version"} {
		t.Run(scope, func(t *testing.T) {
			pool := newPool(t)
			ctx := context.Background()
			spec := custSpec("public")
			spec.SnapshotDeletes = true
			spec.Type1Scope = sink.Type1Scope(scope)
			owner, other := newSink(t, pool, "public", spec), newSink(t, pool, "public", spec)
			h := func(n int) time.Time { return day.Add(time.Duration(n) * time.Hour) }
			p0 := change.Partition{Topic: "shop.public.customers", Partition: 0}
			p1 := change.Partition{Topic: "shop.public.customers", Partition: 1}
			var all []*change.Event
			apply := func(s *sink.Sink, b sink.Batch) {
				t.Helper()
				if _, err := s.Apply(ctx, b); err != nil {
					t.Fatal(err)
				}
				all = append(all, b.Events...)
			}
			keys := []string{"K1", "K2", "K3"}
			var creates []*change.Event
			for i, k := range keys {
				creates = append(creates, cust(change.OpCreate, int64(10+i), h(1), k, "name", k, "plan", "basic"))
			}
			apply(owner, sink.Batch{Events: creates, Positions: sink.At(map[change.Partition]int64{p0: 3})}) // owner remembers K1-K3
			// Between the chunks (one key each) the owner changes every key
			// (Type 1 only), from what it remembers.
			step := 0
			other.Tune(func(tu *sink.Tuning) {
				tu.ReconcileChunk, tu.AfterReconcileChunk = 1, func() {
					if step++; step != 1 {
						return
					}
					var upd []*change.Event
					for i, k := range keys {
						upd = append(upd, cust(change.OpUpdate, int64(150+i), h(8), k, "name", strings.ToLower(k), "plan", "basic"))
					}
					apply(owner, sink.Batch{Events: upd, Positions: sink.At(map[change.Partition]int64{p0: 6})})
				}
			})
			end := cust(change.OpRead, 100, h(5), "K9", "name", "nine", "plan", "basic")
			end.SnapshotEnd = true
			apply(other, sink.Batch{Events: []*change.Event{end}, Positions: sink.At(map[change.Partition]int64{p1: 1}),
				Snapshots: []sink.Snapshot{{Target: spec.Target, Seq: change.MustSeq(100), At: h(5), Topic: p0.Topic, Until: map[int32]int64{0: 3, 1: 1}}}})
			if step != len(keys) {
				t.Fatalf("%d chunks, want %d", step, len(keys))
			}
			want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, all))
			if d := scdtest.DiffLines(want, scdtest.HistoryLines(t, pool, spec, custCols)); d != "" {
				t.Fatalf("history differs from the fold:\n%s", d)
			}
			verifyClean(t, owner, spec.Target)
		})
	}
}
