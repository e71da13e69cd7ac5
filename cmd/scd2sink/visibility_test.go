package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/app"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
)

// visibility follows produced events until a reader of their history
// table sees the version each opens: the row of its key with its sequence
// (decoded from the record as the binary decodes it). Events that open no
// version (Type-1-only updates, deletes, tombstones) are not followed.
type visibility struct {
	mu   sync.Mutex
	dec  *debezium.Decoder
	last map[string]map[int64]scdtest.Row // per table, each key's last after image
	wait map[string][]pending             // per history table, events not seen yet
}

type pending struct {
	id  int64
	seq change.Seq
	at  time.Time
}

func newVisibility(tb testing.TB, cfgFile string) *visibility {
	tb.Helper()
	cfg, err := config.Load(cfgFile)
	if err != nil {
		tb.Fatal(err)
	}
	return &visibility{dec: debezium.New(app.Rules(cfg), nil, nil), last: map[string]map[int64]scdtest.Row{}, wait: map[string][]pending{}}
}

// sent notes an event produced at at and follows it (follow) if it
// opens a version; every event's image is kept, to tell which later
// updates change a tracked column.
func (v *visibility) sent(tb testing.TB, w scdtest.BenchRecord, key, value []byte, at time.Time, follow bool) {
	tb.Helper()
	if w.Tombstone {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	tbl := w.Src.Table
	if v.last[tbl] == nil {
		v.last[tbl] = map[int64]scdtest.Row{}
	}
	opens := false
	switch w.Change.Op {
	case "c", "r":
		opens = true
	case "u":
		old := v.last[tbl][rowID(w.Change.After)]
		for _, c := range scdtest.BenchTracked[tbl] {
			if old == nil || fmt.Sprint(old[c]) != fmt.Sprint(w.Change.After[c]) {
				opens = true
			}
		}
	}
	if w.Change.After != nil {
		v.last[tbl][rowID(w.Change.After)] = w.Change.After
	}
	if !opens || !follow {
		return
	}
	ev, err := v.dec.Decode(context.Background(), change.Origin{Partition: change.Partition{Topic: w.Src.Topic()}}, key, value)
	if err != nil {
		tb.Fatal(err)
	}
	hist := tbl + "_history"
	v.wait[hist] = append(v.wait[hist], pending{id: rowID(w.Change.After), seq: ev.Seq, at: at})
}

// rowID is a benchmark row's key.
func rowID(r scdtest.Row) int64 {
	switch id := r["id"].(type) {
	case int:
		return int64(id)
	case int64:
		return id
	}
	panic(fmt.Sprintf("benchmark row without an integer id: %v", r))
}

// poll asks each history table for the followed versions and returns the
// latencies of those now visible.
func (v *visibility) poll(ctx context.Context, pool *pgxpool.Pool) []time.Duration {
	v.mu.Lock()
	asked := map[string][]pending{}
	for hist, ps := range v.wait {
		asked[hist] = ps
	}
	v.mu.Unlock()
	var out []time.Duration
	for hist, ps := range asked {
		if len(ps) == 0 {
			continue
		}
		ids, seqs := make([]int64, len(ps)), make([][]byte, len(ps))
		for i, p := range ps {
			ids[i], seqs[i] = p.id, p.seq
		}
		rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT x.i FROM unnest($1::bigint[], $2::bytea[]) WITH ORDINALITY AS x(id, seq, i)
			WHERE EXISTS (SELECT 1 FROM %s h WHERE h.id = x.id AND h.scd_seq = x.seq)`, hist), ids, seqs)
		if err != nil {
			continue // not created yet
		}
		now := time.Now()
		seen := map[int64]bool{}
		for rows.Next() {
			var i int64
			if rows.Scan(&i) == nil {
				seen[i-1] = true
			}
		}
		rows.Close()
		if len(seen) == 0 {
			continue
		}
		v.mu.Lock()
		// Events sent since the poll began are after ps in the list.
		rest := v.wait[hist][:0:0]
		for i, p := range v.wait[hist] {
			if i < len(ps) && seen[int64(i)] {
				out = append(out, now.Sub(p.at))
				continue
			}
			rest = append(rest, p)
		}
		v.wait[hist] = rest
		v.mu.Unlock()
	}
	return out
}

// outstanding is how many followed events are not visible yet.
func (v *visibility) outstanding() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, ps := range v.wait {
		n += len(ps)
	}
	return n
}
