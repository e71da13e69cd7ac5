package sink_test

import (
	"context"
	"sync"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
)

// TestForgetWhileApplying: a rebalance callback may call Forget while a
// batch abandoned after the revoke budget is still being applied. Forget
// must neither race with the apply (run with -race) nor leave the memory
// of a batch applied across it; the history stays equal to the fold.
func TestForgetWhileApplying(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	spec := custSpec("public")
	s := newSink(t, pool, "public", spec)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				s.Forget()
			}
		}
	}()
	var all []*change.Event
	plans := []string{"basic", "pro", "team"}
	for b := 0; b < 40; b++ {
		var batch []*change.Event
		for k := 0; k < 20; k++ {
			op := change.OpUpdate
			if b == 0 {
				op = change.OpCreate
			}
			seq := int64(b*100 + k + 1)
			batch = append(batch, cust(op, seq, day.AddDate(0, 0, b), "C"+itoa(k), "name", "n", "plan", plans[(b+k)%3], "city", "Wien", "visits", b))
		}
		if _, err := s.Apply(context.Background(), sink.Batch{Events: batch}); err != nil {
			t.Fatal(err)
		}
		all = append(all, batch...)
	}
	close(stop)
	wg.Wait()
	want := scdtest.ModelLines(spec, custCols, scdtest.Fold(spec, custCols, all))
	got := scdtest.HistoryLines(t, pool, spec, custCols)
	if d := scdtest.DiffLines(want, got); d != "" {
		t.Fatalf("history differs from the fold:\n%s", d)
	}
	verifyClean(t, s, spec.Target)
}
