package carry_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/scd2sink/scd2sink/sink/carry"
)

// TestCarryRefusesLossyTypes: a rebuild's table whose column the source
// narrowed (numeric(10,2) to numeric(10,1), text to varchar(3)) would
// change carried values: Read refuses before carrying anything and names
// the column, while a change of type that keeps every value
// (numeric(12,2)) is carried; a changed key is refused too.
func TestCarryRefusesLossyTypes(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const schema = "carry_types"
	table := func(target, amount, code string, keys ...string) {
		t.Helper()
		spec := sink.TableSpec{Target: target, Schema: schema, Keys: keys,
			Columns: []sink.Column{{Name: "id", Type: "bigint"}, {Name: "region", Type: "text"},
				{Name: "amount", Type: amount}, {Name: "code", Type: code}}}
		s, err := sink.New(sink.Config{Schema: schema, Tables: []sink.TableSpec{spec}}, pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Init(ctx); err != nil {
			t.Fatal(err)
		}
		if target != "live_history" {
			return
		}
		ev := &change.Event{Table: target, Key: []any{json.Number("1")}, Seq: change.MustSeq(1), Op: change.OpCreate,
			ValidFrom: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC),
			After:     map[string]any{"id": json.Number("1"), "region": "eu", "amount": json.Number("12.25"), "code": "ABCD"},
			Origin:    change.Origin{Partition: change.Partition{Topic: "src"}, Offset: 1}}
		if _, err := s.Apply(ctx, sink.Batch{Events: []*change.Event{ev}}); err != nil {
			t.Fatal(err)
		}
	}
	table("live_history", "numeric(10,2)", "text", "id")
	for _, tc := range []struct {
		name, amount, code string
		keys               []string
		refused            string // in the error; "" when carried
	}{
		{"fewer decimals", "numeric(10,1)", "text", []string{"id"}, "column amount is of type numeric(10,2)"},
		{"shorter text", "numeric(10,2)", "character varying(3)", []string{"id"}, "column code is of type text"},
		{"another key", "numeric(10,2)", "text", []string{"id", "region"}, "cannot be carried across a change of key"},
		{"wider", "numeric(12,2)", "text", []string{"id"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			into := "into_" + strings.ReplaceAll(tc.name, " ", "_") + "_history"
			table(into, tc.amount, tc.code, tc.keys...)
			var carried []*change.Event
			_, err := carry.Read(ctx, pool, carry.Pair{Schema: schema, Live: "live_history", Into: into}, 100, func(evs []*change.Event) error {
				carried = append(carried, evs...)
				return nil
			})
			if tc.refused == "" {
				if err != nil || len(carried) != 1 || carried[0].After["amount"] == nil {
					t.Fatalf("carrying into %s: %v, %d events", tc.amount, err, len(carried))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.refused) || len(carried) != 0 {
				t.Fatalf("carrying into (%s, %s) keyed by %v: err %v (want %q), %d events carried", tc.amount, tc.code, tc.keys, err, tc.refused, len(carried))
			}
		})
	}
}
