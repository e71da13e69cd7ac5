package sink

import (
	"sync/atomic"
	"time"

	"github.com/scd2sink/scd2sink/sink/apply"
	"github.com/scd2sink/scd2sink/sink/maint"
)

// tuning holds the sizes and hooks a Sink's maintenance and repairs work
// with. New sets the service's values; tests change them per Sink
// (export_test.go), so that tests owning their database run side by
// side without sharing a setting.
type tuning struct {
	// MinSplitEvents is the smallest batch applied in parts: below it a
	// second transaction costs more than it saves (parallel.go).
	MinSplitEvents int
	// ReconcileChunk is how many keys' deletes one reconciliation batch
	// carries; AfterReconcileChunk, when set, is called once each has
	// committed (reconcile.go).
	ReconcileChunk      int
	AfterReconcileChunk func()
	// LateRerunEvery bounds how often one Sink runs a reconciliation
	// again for late events (reconcile.go).
	LateRerunEvery time.Duration
	// Tuning holds retention's chunk and window sizes and its hook
	// (package maint).
	maint.Tuning
	// Apply holds the repairs' and truncates' sizes (package apply).
	Apply apply.Tuning
}

// defaultTuning is the service's tuning.
func defaultTuning() tuning {
	return tuning{
		MinSplitEvents: 2000,
		Apply:          apply.Tuning{TruncateChunk: 5000},
		ReconcileChunk: 5000,
		LateRerunEvery: 10 * time.Second,
		Tuning:         maint.DefaultTuning(),
	}
}

// counters count, per Sink, which ways its batches took (tests see that
// a path was taken).
type counters struct {
	// splitBatches counts batches applied in parts (parallel.go).
	splitBatches atomic.Int64
}
