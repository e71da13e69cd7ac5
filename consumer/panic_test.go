package consumer

import (
	"context"
	"strings"
	"testing"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// panickySink panics where a corrupt value once made the sink panic.
type panickySink struct{ recordingSink }

func (panickySink) ApplyPrepared(context.Context, *sink.Prepared) (sink.Result, error) {
	var evs []int
	_ = evs[0] // index out of range, as at sink/apply.go:87 before issue 13
	return sink.Result{}, nil
}

// TestPanicStopsLoudly: a panic while applying a batch is turned into an
// error that stops the service (the applier commits nothing), logged with
// the batch's offsets and the stack; never a silent exit, never a retry
// loop.
func TestPanicStopsLoudly(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.ErrorLevel)
	ps := &panickySink{}
	c := &Consumer{cfg: Config{Classify: sink.Classify}, sink: ps, batches: ps, ledger: ps, marks: ps, m: NewMetrics(nil), health: &Health{}, log: zap.New(core)}
	p := change.Partition{Topic: "shop.public.customers", Partition: 2}
	err := c.apply(context.Background(), job{offsets: map[change.Partition]int64{p: 42}, events: 7}, nil)
	if err == nil || !strings.Contains(err.Error(), "panic") || !strings.Contains(err.Error(), "shop.public.customers/2@42") {
		t.Fatalf("apply: %v, want an error naming the panic and the batch's offsets", err)
	}
	if sink.Classify(err) != sink.Fatal {
		t.Errorf("a panic classifies as %s, want fatal (stop, not retry)", sink.Classify(err))
	}
	entries := logs.FilterMessageSnippet("panic").All()
	if len(entries) != 1 {
		t.Fatalf("%d log entries about the panic, want 1", len(entries))
	}
	fields := entries[0].ContextMap()
	if stack, _ := fields["stack"].(string); !strings.Contains(stack, "ApplyPrepared") {
		t.Errorf("the log has no stack through ApplyPrepared: %v", fields)
	}
}
