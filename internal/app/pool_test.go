package app

import (
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/config"
)

// TestPoolStatementCache: every connection keeps statementCache prepared
// statements (a handful per history table, for hundreds of tables),
// unless the DSN sets statement_cache_capacity.
func TestPoolStatementCache(t *testing.T) {
	for _, tc := range []struct {
		name, dsn string
		want      int
	}{
		{"url", "postgres://u@h:5432/db?sslmode=disable", statementCache},
		{"key=value", "host=h user=u dbname=db", statementCache},
		{"url sets it", "postgres://u@h:5432/db?statement_cache_capacity=64", 64},
		{"key=value sets it", "host=h user=u statement_cache_capacity=512", 512},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &config.Config{}
			cfg.Postgres.DSN, cfg.Postgres.LockTimeout, cfg.Postgres.StatementTimeout = tc.dsn, 5*time.Second, time.Minute
			cfg.Kafka.SessionTimeout = 45 * time.Second
			pc, err := poolConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := pc.ConnConfig.StatementCacheCapacity; got != tc.want {
				t.Errorf("statement cache %d, want %d", got, tc.want)
			}
			if _, ok := pc.ConnConfig.RuntimeParams["statement_cache_capacity"]; ok {
				t.Error("statement_cache_capacity sent to the server as a setting")
			}
		})
	}
}
