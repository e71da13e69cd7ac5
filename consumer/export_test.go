package consumer

import "time"

// SetRevokeBudget makes consumers made with cfg wait at most d for
// batches in flight when a rebalance comes.
func SetRevokeBudget(cfg *Config, d time.Duration) { cfg.revokeBudget = d }
