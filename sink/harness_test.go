package sink_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/sink"
)

var (
	sharedOnce sync.Once
	sharedDSN  string
)

// sharedPool returns a pool on a database that tests share, each in its own
// schema; it is cheaper than a database per scenario.
func sharedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	sharedOnce.Do(func() { sharedDSN = pgtest.NewDatabase(&onceT{T: t}) })
	return openPool(t, sharedDSN)
}

// onceT keeps the shared database alive past the test that created it.
type onceT struct{ *testing.T }

func (o *onceT) Cleanup(func()) {}

func openPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return openPool(t, pgtest.NewDatabase(t))
}

func newSink(t *testing.T, pool *pgxpool.Pool, schema string, specs ...sink.TableSpec) *sink.Sink {
	t.Helper()
	s, err := sink.New(sink.Config{Schema: schema, Tables: specs}, pool)
	if err != nil {
		t.Fatalf("sink.New: %v", err)
	}
	if err := s.Init(context.Background()); err != nil {
		t.Fatalf("sink.Init: %v", err)
	}
	return s
}

func apply(t *testing.T, s *sink.Sink, evs ...*change.Event) sink.Result {
	t.Helper()
	res, err := s.Apply(context.Background(), sink.Batch{Events: evs})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return res
}

func textOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "∅"
	case string:
		return x
	case json.Number:
		return x.String()
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	default:
		return fmt.Sprint(x)
	}
}

func tsText(t *time.Time) string {
	if t == nil {
		return "open"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// modelLines renders the model's versions like historyLines renders the table.
func modelLines(spec sink.TableSpec, cols []string, vs []mVersion) []string {
	var out []string
	for _, v := range vs {
		var key, vals []string
		for _, k := range spec.Keys {
			key = append(key, textOf(v.row[k]))
		}
		for _, c := range cols {
			vals = append(vals, c+"="+textOf(v.row[c]))
		}
		out = append(out, fmt.Sprintf("%s seq=%s [%s, %s) current=%v %s", strings.Join(key, "|"),
			hex.EncodeToString([]byte(v.seq)), tsText(&v.from), tsText(v.to), v.current, strings.Join(vals, " ")))
	}
	sort.Strings(out)
	return out
}

// historyLines reads a history table, one line per version.
func historyLines(t *testing.T, pool *pgxpool.Pool, spec sink.TableSpec, cols []string) []string {
	t.Helper()
	var sel []string
	for _, k := range spec.Keys {
		sel = append(sel, pgx.Identifier{k}.Sanitize()+"::text")
	}
	for _, c := range cols {
		sel = append(sel, pgx.Identifier{c}.Sanitize()+"::text")
	}
	q := fmt.Sprintf("SELECT %s, valid_from, valid_to, is_current, scd_seq FROM %s", strings.Join(sel, ", "),
		pgx.Identifier{spec.Schema, spec.Target}.Sanitize())
	rows, err := pool.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("reading %s: %v", spec.Target, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		texts := make([]*string, len(sel))
		dest := make([]any, 0, len(sel)+4)
		for i := range texts {
			dest = append(dest, &texts[i])
		}
		var from time.Time
		var to *time.Time
		var cur bool
		var seq []byte
		dest = append(dest, &from, &to, &cur, &seq)
		if err := rows.Scan(dest...); err != nil {
			t.Fatalf("scanning %s: %v", spec.Target, err)
		}
		str := func(p *string) string {
			if p == nil {
				return "∅"
			}
			return *p
		}
		var key, vals []string
		for i := range spec.Keys {
			key = append(key, str(texts[i]))
		}
		for i, c := range cols {
			vals = append(vals, c+"="+str(texts[len(spec.Keys)+i]))
		}
		out = append(out, fmt.Sprintf("%s seq=%s [%s, %s) current=%v %s", strings.Join(key, "|"),
			hex.EncodeToString(seq), tsText(&from), tsText(to), cur, strings.Join(vals, " ")))
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("reading %s: %v", spec.Target, err)
	}
	sort.Strings(out)
	return out
}

// diffLines returns a readable difference, or "" when equal.
func diffLines(want, got []string) string {
	w, g := map[string]int{}, map[string]int{}
	for _, l := range want {
		w[l]++
	}
	for _, l := range got {
		g[l]++
	}
	var b strings.Builder
	for _, l := range want {
		if g[l] < w[l] {
			fmt.Fprintf(&b, "  missing: %s\n", l)
			g[l]++
		}
	}
	w2 := map[string]int{}
	for _, l := range want {
		w2[l]++
	}
	for _, l := range got {
		if w2[l] == 0 {
			fmt.Fprintf(&b, "  extra:   %s\n", l)
		} else {
			w2[l]--
		}
	}
	return b.String()
}

func verifyClean(t *testing.T, s *sink.Sink, target string) {
	t.Helper()
	vs, err := s.Verify(context.Background(), target)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	for _, v := range vs {
		t.Errorf("violation: %s", v)
	}
}

func newBenchDSN(b *testing.B) string {
	b.Helper()
	return pgtest.NewDatabase(b)
}
