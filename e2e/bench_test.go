//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPeerBenchmark (E2E_BENCH=1, make e2e-bench): a backlog of at least
// 200,000 Debezium events of customers in Kafka, read into the same target
// PostgreSQL by Debezium's JDBC sink connector (upsert, latest row only) in
// the same Connect worker, then by scd2sink (full history). Reports each
// one's events/s and the ratio.
func TestPeerBenchmark(t *testing.T) {
	if os.Getenv("E2E_BENCH") == "" {
		t.Skip("the peer benchmark runs with E2E_BENCH=1 (make e2e-bench)")
	}
	skipOnCompose(t)
	ctx := context.Background()
	st := newStack(t, ctx, 1)
	const rows, rounds = 50000, 12 // 50,000 inserts + 12 × 12,500 updates
	start := time.Now()
	if _, err := st.src.pool.Exec(ctx, `INSERT INTO customers
		SELECT g, 'Customer ' || g, (ARRAY['basic','pro','team'])[1 + g % 3], (ARRAY['Wien','Linz','Graz','Salzburg'])[1 + g % 4],
			g * 1.25, date '1950-01-01' + g % 20000, timestamptz '2026-01-01' + g * interval '1 second',
			jsonb_build_object('tier', g % 5, 'score', 1.10), gen_random_uuid(), repeat('bio of ' || g || ' ', 30)
		FROM generate_series(1, $1) g`, rows); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < rounds; r++ {
		q := `UPDATE customers SET plan = (ARRAY['basic','pro','team','enterprise'])[1 + (id + $1) % 4], updated_at = updated_at + interval '1 hour' WHERE id % 4 = $2`
		if r%3 == 2 { // an untracked change: Type 1 only
			q = `UPDATE customers SET name = name || '.', updated_at = updated_at + interval '1 hour' WHERE id % 4 = $2 AND $1 >= 0`
		}
		if _, err := st.src.pool.Exec(ctx, q, r, r%4); err != nil {
			t.Fatal(err)
		}
	}
	total := int64(rows + rounds*rows/4)
	cl, err := kgo.NewClient(kgo.SeedBrokers(st.kafka.addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	const topic = "shop.public.customers"
	endOffset := func() int64 {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return 0
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	if err := waitFor(ctx, 10*time.Minute, func() (bool, error) { return endOffset() >= total, nil }); err != nil {
		t.Fatalf("Debezium published %d of %d events: %v", endOffset(), total, err)
	}
	end := endOffset()
	t.Logf("backlog: %d events in %s (source changes and Debezium, %v)", end, topic, time.Since(start).Round(time.Second))

	// The peer: Debezium's JDBC sink, latest row only.
	jdbc := fmt.Sprintf(`{"connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector", "tasks.max": "1",
		"topics": %q, "connection.url": "jdbc:postgresql://127.0.0.1:%s/warehouse", "connection.username": "postgres",
		"connection.password": "unused", "insert.mode": "upsert", "primary.key.mode": "record_key", "delete.enabled": "true",
		"schema.evolution": "basic", "batch.size": "2000", "consumer.override.max.poll.records": "2000",
		"collection.name.format": "jdbc_customers"}`, topic, portOf(st.targetDSN))
	req, _ := http.NewRequest(http.MethodPut, fmt.Sprintf("http://127.0.0.1:%d/connectors/jdbc-sink/config", st.conn.rest), bytes.NewBufferString(jdbc))
	req.Header.Set("Content-Type", "application/json")
	peerStart := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		t.Fatalf("registering the JDBC sink: %s\n%s", resp.Status, st.conn.proc.tail(30))
	}
	committed := func(group string) int64 {
		offs, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return 0
		}
		var n int64
		offs.Each(func(o kadm.OffsetResponse) {
			if o.Topic == topic {
				n += o.At
			}
		})
		return n
	}
	if err := waitFor(ctx, 15*time.Minute, func() (bool, error) { return committed("connect-jdbc-sink") >= end, nil }); err != nil {
		t.Fatalf("the JDBC sink committed %d of %d: %v\n%s", committed("connect-jdbc-sink"), end, err, st.conn.proc.tail(30))
	}
	peer := time.Since(peerStart)

	// scd2sink, full history, over the same topic.
	sinkStart := time.Now()
	p := runSink(t, st.dir, "scd2sink", st.kafka.addr(), st.targetDSN)
	if err := waitFor(ctx, 15*time.Minute, func() (bool, error) {
		var n int64
		err := st.tpool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets WHERE topic = $1`, topic).Scan(&n)
		return n >= end, err
	}); err != nil {
		t.Fatalf("scd2sink did not catch up: %v\n%s", err, p.tail(20))
	}
	ours := time.Since(sinkStart)
	p.stop(30 * time.Second)
	peerRate, ourRate := float64(end)/peer.Seconds(), float64(end)/ours.Seconds()
	t.Logf("Debezium JDBC sink 3.6.0 (upsert, latest row): %d events in %v = %.0f events/s", end, peer.Round(time.Millisecond), peerRate)
	t.Logf("scd2sink (SCD2 history): %d events in %v = %.0f events/s", end, ours.Round(time.Millisecond), ourRate)
	t.Logf("ratio scd2sink / JDBC sink: %.2f", ourRate/peerRate)
	var versions, latest int64
	_ = st.tpool.QueryRow(ctx, `SELECT count(*) FROM customers_history`).Scan(&versions)
	_ = st.tpool.QueryRow(ctx, `SELECT count(*) FROM jdbc_customers`).Scan(&latest)
	t.Logf("customers_history holds %d versions; the JDBC sink's jdbc_customers %d rows", versions, latest)
	if latest != rows || versions < rows {
		t.Errorf("a sink did not write what it read: %d latest rows (want %d), %d versions", latest, rows, versions)
	}
}

func portOf(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return ""
	}
	return u.Port()
}
