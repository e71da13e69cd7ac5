//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// mixedTables is the published mixed workload's table count.
const mixedTables = 10

// TestMixedBenchmark (E2E_BENCH=1, make e2e-bench): the mixed workload
// others publish (Wirekite: 2 M inserts, 6 M updates and 2 M deletes over
// 10 tables, single-row source transactions), scaled down by
// E2E_MIX_SCALE (100 by default: 20,000 inserts, 60,000 updates, 20,000
// deletes), through the real PostgreSQL connector into 10 topics; then
// Debezium's JDBC sink and scd2sink over the same topics, in three
// alternating pairs, as TestPeerBenchmark. It reports each side's
// events/s, CPU and peak memory.
//
// Then a live phase measures the end-to-end lag, for each sink alone: the
// sink starts at the topics' end, the same load runs on the source at
// E2E_MIX_LIVE_SCALE (twice E2E_MIX_SCALE by default: half the rows),
// paced at E2E_MIX_LIVE_RATE changes a second (2,000), and
// the lag (now less the newest source commit time the sink's database
// shows) is sampled every second while it runs. It reports the lag's p50,
// p99 and max, how long after the load's last commit the sink had every
// record, and the source's rate (runMixLive).
func TestMixedBenchmark(t *testing.T) {
	if os.Getenv("E2E_BENCH") == "" {
		t.Skip("the mixed benchmark runs with E2E_BENCH=1 (make e2e-bench)")
	}
	skipOnCompose(t)
	ctx := context.Background()
	scale := 100
	if v := os.Getenv("E2E_MIX_SCALE"); v != "" {
		fmt.Sscan(v, &scale)
	}
	perTable := 2_000_000 / scale / mixedTables // inserts per table
	var capture []string
	for i := range mixedTables {
		capture = append(capture, fmt.Sprintf("public.mix_%d", i))
	}
	st := newStackWith(t, ctx, stackOpts{capture: strings.Join(capture, ","), before: func(st *stack) {
		for i := range mixedTables {
			if _, err := st.src.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE mix_%d (id int PRIMARY KEY, name text, status text,
				amount numeric(12,2), updated_at timestamptz, note text)`, i)); err != nil {
				t.Fatal(err)
			}
		}
	}})
	// Single-row transactions: a procedure commits after each statement.
	// Inserts first (each table's ids 1..perTable), then rounds over the
	// tables of three updates of a random live row and a delete, the
	// deletes in id order: every row is deleted in the end.
	// rate > 0 paces it at about rate changes a second (the live phase).
	if _, err := st.src.pool.Exec(ctx, `CREATE PROCEDURE mix_load(per int, tables int, rate int DEFAULT 0) LANGUAGE plpgsql AS $$
		DECLARE k int; gone int[] := array_fill(0, ARRAY[tables]); n bigint := 0; t0 timestamptz := clock_timestamp();
		BEGIN
			FOR i IN 1..per LOOP
				FOR t IN 0..tables-1 LOOP
					EXECUTE format('INSERT INTO mix_%s VALUES ($1, $2, ''new'', $1 * 1.5, now(), repeat(''x'', 200))', t)
						USING i, 'row ' || i;
					COMMIT;
					n := n + 1;
					IF rate > 0 AND n % 20 = 0 THEN
						PERFORM pg_sleep(greatest(0, extract(epoch FROM t0 + make_interval(secs => n::float8 / rate) - clock_timestamp())));
					END IF;
				END LOOP;
			END LOOP;
			FOR r IN 0..per*4-1 LOOP
				FOR t IN 0..tables-1 LOOP
					IF r % 4 = 3 THEN
						gone[t+1] := gone[t+1] + 1;
						EXECUTE format('DELETE FROM mix_%s WHERE id = $1', t) USING gone[t+1];
					ELSE
						k := gone[t+1] + 1 + floor(random() * (per - gone[t+1]))::int;
						EXECUTE format('UPDATE mix_%s SET status = (ARRAY[''open'',''held'',''paid''])[1 + $2 %% 3], amount = amount + 1, updated_at = now() WHERE id = $1', t)
							USING least(k, per), r;
					END IF;
					COMMIT;
					n := n + 1;
					IF rate > 0 AND n % 20 = 0 THEN
						PERFORM pg_sleep(greatest(0, extract(epoch FROM t0 + make_interval(secs => n::float8 / rate) - clock_timestamp())));
					END IF;
				END LOOP;
			END LOOP;
		END $$`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := st.src.pool.Exec(ctx, fmt.Sprintf(`CALL mix_load(%d, %d)`, perTable, mixedTables), pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	ops := perTable * mixedTables * 5 // inserts + 3 updates and a delete per insert
	t.Logf("source: %d single-row transactions (%d inserts, %d updates, %d deletes) in %v", ops, ops/5, ops*3/5, ops/5, time.Since(start).Round(time.Second))
	cl, err := kgo.NewClient(kgo.SeedBrokers(st.kafka.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	endOffset := func() int64 {
		ends, err := adm.ListEndOffsets(ctx, mixTopics()...)
		if err != nil {
			return 0
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	want := int64(ops + ops/5) // every delete is followed by its tombstone
	if err := waitFor(ctx, 15*time.Minute, func() (bool, error) { return endOffset() >= want, nil }); err != nil {
		t.Fatalf("Debezium published %d of %d records: %v", endOffset(), want, err)
	}
	end := endOffset()
	t.Logf("backlog: %d records in %d topics (%d changes), %v after the load began", end, mixedTables, ops, time.Since(start).Round(time.Second))
	committed := func(group string) int64 {
		offs, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return 0
		}
		var n int64
		offs.Each(func(o kadm.OffsetResponse) {
			if isMixTopic(o.Topic) {
				n += o.At
			}
		})
		return n
	}
	var ratios []float64
	for pair := 1; pair <= 3; pair++ {
		peer, peerCPU, peerRSS := runMixJDBC(t, ctx, st, pair, end, committed)
		ours, ourCPU, ourRSS := runMixOurs(t, ctx, st, adm, pair, end, perTable)
		peerRate, ourRate := float64(ops)/peer.Seconds(), float64(ops)/ours.Seconds()
		ratios = append(ratios, ourRate/peerRate)
		t.Logf("pair %d: Debezium JDBC sink 3.6.0 (upsert, latest row): %d changes in %v = %.0f changes/s, %.1f s of Connect's CPU, Connect's RSS %.0f MiB",
			pair, ops, peer.Round(time.Millisecond), peerRate, peerCPU, peerRSS)
		t.Logf("pair %d: scd2sink (SCD2 history): %d changes in %v = %.0f changes/s, %.1f s of CPU, peak RSS %.0f MiB", pair, ops, ours.Round(time.Millisecond), ourRate, ourCPU, ourRSS)
		t.Logf("pair %d: ratio scd2sink / JDBC sink: %.2f", pair, ourRate/peerRate)
	}
	t.Logf("mixed workload, ratios scd2sink / JDBC sink: %.2f, %.2f, %.2f", ratios[0], ratios[1], ratios[2])
	liveScale := 2 * scale
	if v := os.Getenv("E2E_MIX_LIVE_SCALE"); v != "" {
		fmt.Sscan(v, &liveScale)
	}
	liveRate := 2000
	if v := os.Getenv("E2E_MIX_LIVE_RATE"); v != "" {
		fmt.Sscan(v, &liveRate)
	}
	runMixLive(t, ctx, st, adm, 2_000_000/liveScale/mixedTables, liveRate)
}

// mixTablesYAML is scd2sink's tables section for the mixed topics.
const mixTablesYAML = "tables:\n  - topic_pattern: 'shop\\.public\\.mix_.*'\n    target: '{table}_history'\n    keys: [id]\n    track_history: [status, amount]\n"

// mixTopics are the mixed workload's topics.
func mixTopics() []string {
	var out []string
	for i := range mixedTables {
		out = append(out, fmt.Sprintf("shop.public.mix_%d", i))
	}
	return out
}

// runMixJDBC runs Debezium's JDBC sink over the mixed topics into a
// database of its own (jdbc_<pair>) until it has committed end, and
// removes it: the time, Connect's CPU meanwhile and its resident set.
func runMixJDBC(t *testing.T, ctx context.Context, st *stack, pair int, end int64, committed func(string) int64) (time.Duration, float64, float64) {
	t.Helper()
	db := fmt.Sprintf("jdbc_%d", pair)
	if _, err := st.tpool.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("jdbc-mix-%d", pair)
	cfg := fmt.Sprintf(`{"connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector", "tasks.max": "1",
		"topics.regex": "shop\\.public\\.mix_.*", "connection.url": "jdbc:postgresql://127.0.0.1:%s/%s", "connection.username": "postgres",
		"connection.password": "unused", "insert.mode": "upsert", "primary.key.mode": "record_key", "delete.enabled": "true",
		"schema.evolution": "basic", "batch.size": "2000", "consumer.override.max.poll.records": "2000"}`, portOf(st.targetDSN), db)
	return timeConnector(t, ctx, st, name, cfg, func() bool { return committed("connect-"+name) >= end })
}

// runMixOurs runs scd2sink over the mixed topics into a database of its
// own (mixhist_<pair>) until scd2sink_offsets reaches end, checks that
// every table holds each key's versions and no current row, and forgets
// its group: the time, its CPU and its peak resident set.
func runMixOurs(t *testing.T, ctx context.Context, st *stack, adm *kadm.Client, pair int, end int64, perTable int) (time.Duration, float64, float64) {
	t.Helper()
	dsn, pool := benchDatabase(t, ctx, st, fmt.Sprintf("mixhist_%d", pair))
	took, cpu, rss := timeSink(t, ctx, st, adm, fmt.Sprintf("scd2sink-mix-%d", pair), dsn, mixTablesYAML, pool, "shop.public.mix_%", end)
	for i := range mixedTables {
		var keys, current int64
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(DISTINCT id), count(*) FILTER (WHERE is_current) FROM mix_%d_history`, i)).Scan(&keys, &current); err != nil {
			t.Fatal(err)
		}
		if keys != int64(perTable) || current != 0 {
			t.Errorf("mix_%d_history: %d keys (want %d), %d current (every row was deleted: want 0)", i, keys, perTable, current)
		}
	}
	return took, cpu, rss
}

// procRSS is a process's resident set now, and procHWM its peak, in MiB
// (0 if unknown).
func procRSS(pid int) float64 { return procStatus(pid, "VmRSS:") }

func procHWM(pid int) float64 { return procStatus(pid, "VmHWM:") }

func procStatus(pid int, field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			var kb float64
			fmt.Sscan(f[1], &kb)
			return kb / 1024
		}
	}
	return 0
}
