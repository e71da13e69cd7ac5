package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/twmb/franz-go/pkg/kfake"
)

// BenchmarkImport: `scd2sink import` of a generic SCD2 table of
// BENCH_IMPORT_VERSIONS versions (default 1,000,000: 5 a key, the last
// current, the others closed where the next starts), against PostgreSQL's
// own INSERT … SELECT of the same rows into a table of the history's
// shape in the same run (the least the database must do to hold them).
// Reports versions/s of each and their ratio.
//
//	go test -run '^$' -bench BenchmarkImport -benchtime 1x -timeout 30m ./internal/app/
func BenchmarkImport(b *testing.B) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("BENCH_IMPORT_VERSIONS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	dsn := pgtest.NewDatabase(b)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	keys := n / 5
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA legacy;
		CREATE TABLE legacy.accounts_scd AS
		SELECT k AS account_id, 'name ' || k AS name, (ARRAY['free','pro','team','enterprise'])[1 + (k + v) %% 4] AS plan,
			(k * 7 + v) %% 1000 AS seats, (k %% 97)::numeric(10,2) * 1.25 AS balance,
			timestamptz '2019-01-01' + (v * interval '90 days') + (k %% 1000) * interval '1 minute' AS valid_from,
			CASE WHEN v < 4 THEN timestamptz '2019-01-01' + ((v + 1) * interval '90 days') + (k %% 1000) * interval '1 minute' END AS valid_to
		FROM generate_series(1, %d) k, generate_series(0, 4) v;
		ANALYZE legacy.accounts_scd`, keys)); err != nil {
		b.Fatal(err)
	}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "src.accounts"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(kafka.Close)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: ""}
tables:
  - {topic: src.accounts, target: accounts_history, keys: [account_id], track_history: [plan, seats]}
`, brokers, dsn)), func(string) (string, bool) { return "", false })
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	if os.Getenv("BENCH_SAMPLE") != "" {
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		counts := map[string]int{}
		go func() {
			for sctx.Err() == nil {
				rows, err := pool.Query(sctx, `SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 120) || ' [' || coalesce(wait_event_type, '') || ']' FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid()`)
				if err == nil {
					for rows.Next() {
						var q string
						_ = rows.Scan(&q)
						counts[q]++
					}
					rows.Close()
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		defer func() {
			for q, n := range counts {
				if n > 5 {
					b.Logf("%5d %s", n, q)
				}
			}
		}()
	}
	var out bytes.Buffer
	start := time.Now()
	if err := Import(ctx, cfg, Options{}, ImportQuery{Table: "accounts_history", From: "legacy.accounts_scd", ValidFrom: "valid_from", ValidTo: "valid_to"}, &out); err != nil {
		b.Fatalf("%v\n%s", err, out.String())
	}
	took := time.Since(start)
	b.StopTimer()
	var got int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM accounts_history").Scan(&got); err != nil || got != int64(n) {
		b.Fatalf("accounts_history holds %d versions (%v), want %d", got, err, n)
	}
	// PostgreSQL's own insert of the same rows into a table of the
	// history's shape (identity, interval, sequence; its key index).
	start = time.Now()
	if _, err := pool.Exec(ctx, `CREATE TABLE plain_insert (account_id integer, name text, plan text, seats integer, balance numeric(10,2),
			scd_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, valid_from timestamptz, valid_to timestamptz, is_current boolean, scd_seq bytea);
		CREATE UNIQUE INDEX ON plain_insert (account_id, scd_seq);
		INSERT INTO plain_insert (account_id, name, plan, seats, balance, valid_from, valid_to, is_current, scd_seq)
		SELECT account_id, name, plan, seats, balance, valid_from, valid_to, valid_to IS NULL, int8send(extract(epoch FROM valid_from)::bigint) FROM legacy.accounts_scd`); err != nil {
		b.Fatal(err)
	}
	plain := time.Since(start)
	b.ReportMetric(float64(n)/took.Seconds(), "versions/s")
	b.ReportMetric(float64(n)/plain.Seconds(), "insert_versions/s")
	b.ReportMetric(plain.Seconds()/took.Seconds(), "of_insert")
	b.Logf("%s", out.String())
}
