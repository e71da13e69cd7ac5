package sink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// memoryLimit is the service's default soft memory limit (GOMEMLIMIT,
// cmd/scd2sink): what a batch may use must stay well under it whatever
// the data holds.
const memoryLimit = 200 << 20

// peakHeap runs fn and returns the highest heap in use seen while it ran,
// sampled every few milliseconds. The collector runs at 50% growth
// meanwhile, so that what is seen is mostly what fn holds, not garbage
// not collected yet: at the default 100%, a heap holding 75 MiB is seen
// anywhere up to 150 MiB, depending on when the samples fall.
func peakHeap(t *testing.T, fn func()) uint64 {
	t.Helper()
	defer debug.SetGCPercent(debug.SetGCPercent(50))
	runtime.GC()
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
		}
	}()
	fn()
	close(stop)
	wg.Wait()
	return peak.Load()
}

// TestTruncateOfManyKeys: a truncate of a table with 200,000 live keys
// folds them again in chunks, with the heap far under the default memory
// limit, and closes every one of them.
func TestTruncateOfManyKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("200,000 keys: not in -short")
	}
	const keys = 200_000
	ctx := context.Background()
	pool := newPool(t)
	s := newSink(t, pool, "public", custSpec("public"))
	// The live versions, written as the sink writes them.
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rows := make([][]any, keys)
	for i := range rows {
		rows[i] = []any{fmt.Sprintf("C%06d", i), "name", "basic", "Wien", int64(i), start, true,
			[]byte(change.MustSeq(int64(i + 1))), "r", []byte("0123456789abcdef")}
	}
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"customers_history"},
		[]string{"customer_id", "name", "plan", "city", "visits", "valid_from", "is_current", "scd_seq", "scd_op", "scd_hash"},
		pgx.CopyFromRows(rows)); err != nil {
		t.Fatal(err)
	}
	rows = nil
	if _, err := pool.Exec(ctx, "ANALYZE customers_history"); err != nil {
		t.Fatal(err)
	}
	trunc := &change.Event{Table: "customers_history", Op: change.OpTruncate, Seq: change.MustSeq(keys + 10),
		ValidFrom: start.Add(24 * time.Hour), Origin: change.Origin{Partition: change.Partition{Topic: "shop.public.customers"}, Offset: 1}}
	began := time.Now()
	var res sink.Result
	peak := peakHeap(t, func() { res = apply(t, s, trunc) })
	t.Logf("truncate of %d live keys: %s, peak heap %d MiB (limit %d MiB), %d keys folded again",
		keys, time.Since(began).Round(time.Millisecond), peak>>20, memoryLimit>>20, res.Repaired)
	if peak > memoryLimit/2 {
		t.Errorf("peak heap %d MiB folding a truncate, want at most %d MiB", peak>>20, memoryLimit>>21)
	}
	if elapsed := time.Since(began); elapsed > time.Minute {
		t.Errorf("the truncate took %s", elapsed)
	}
	var live, closed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE is_current), count(*) FILTER (WHERE valid_to = $1)
		FROM customers_history`, trunc.ValidFrom).Scan(&live, &closed); err != nil {
		t.Fatal(err)
	}
	if live != 0 || closed != keys {
		t.Errorf("after the truncate: %d live, %d closed at its time; want 0 and %d", live, closed, keys)
	}
}

// TestRepairOfLongHistory: a late event that moves the times of all of a
// 50,000-version key's versions (its time is later than theirs, so theirs
// are clamped to it) is repaired under the memory limit, and its audit
// row holds the first 1,000 changed versions on each side and counts the
// rest.
func TestRepairOfLongHistory(t *testing.T) {
	if testing.Short() {
		t.Skip("50,000 versions: not in -short")
	}
	const versions = 50_000
	ctx := context.Background()
	pool := newPool(t)
	s := newSink(t, pool, "public", custSpec("public"))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	plans := []string{"basic", "pro"}
	for b := 0; b < versions; b += 10_000 {
		var evs []*change.Event
		for i := b; i < b+10_000; i++ {
			op := change.OpUpdate
			if i == 0 {
				op = change.OpCreate
			}
			evs = append(evs, cust(op, int64(10*(i+1)), start.Add(time.Duration(i)*time.Minute), "K",
				"name", "Kim", "plan", plans[i%2], "city", "Wien", "visits", 1))
		}
		apply(t, s, evs...)
	}
	late := cust(change.OpUpdate, 15, start.Add(time.Duration(versions)*time.Minute), "K",
		"name", "Kim", "plan", "team", "city", "Wien", "visits", 1)
	var res sink.Result
	began := time.Now()
	peak := peakHeap(t, func() { res = apply(t, s, late) })
	t.Logf("repair of a key with %d versions: %s, peak heap %d MiB", versions, time.Since(began).Round(time.Millisecond), peak>>20)
	if res.Repaired != 1 {
		t.Fatalf("%d keys repaired", res.Repaired)
	}
	if peak > memoryLimit*3/4 {
		t.Errorf("peak heap %d MiB repairing one key, want at most %d MiB", peak>>20, memoryLimit*3/4>>20)
	}
	var before, after json.RawMessage
	var nBefore, nAfter, omitted int
	if err := pool.QueryRow(ctx, `SELECT before, after, jsonb_array_length(before), jsonb_array_length(after), omitted
		FROM customers_history_scd_repairs`).Scan(&before, &after, &nBefore, &nAfter, &omitted); err != nil {
		t.Fatal(err)
	}
	// The 1,000 earliest changed versions: the late event's own (no
	// before) and the 999 after it.
	if nBefore != 999 || nAfter != 1000 || omitted != versions+1-1000 {
		t.Errorf("audit: %d versions before, %d after, %d omitted; want 999, 1000, %d", nBefore, nAfter, omitted, versions+1-1000)
	}
	t.Logf("audit row: before %d KB, after %d KB", len(before)>>10, len(after)>>10)
	verifyClean(t, s, "customers_history")
}
