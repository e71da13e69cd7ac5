package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/app"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const demoTopic = "shop.public.customers"

// demoEvent is one change of the scripted scenario.
type demoEvent struct {
	lsn  int64
	day  string
	op   string
	id   string
	row  []string // name, plan, city
	note string
}

var demoScript = []demoEvent{
	{100, "2026-01-01", "r", "C1001", []string{"Sara Meier", "basic", "Wien"}, "snapshot"},
	{101, "2026-01-01", "r", "C1002", []string{"Marko Horvat", "basic", "Graz"}, "snapshot"},
	{102, "2026-01-01", "r", "C1003", []string{"Anna Berger", "pro", "Salzburg"}, "snapshot"},
	{200, "2026-02-01", "u", "C1001", []string{"Sarah Meier", "basic", "Wien"}, "typo in the name fixed (Type 1: no new version)"},
	{300, "2026-03-01", "u", "C1001", []string{"Sarah Meier", "pro", "Wien"}, "Sarah upgrades to pro"},
	{301, "2026-03-01", "u", "C1002", []string{"Marko Horvat", "pro", "Linz"}, "Marko moves to Linz"},
	{302, "2026-03-01", "r", "C1003", []string{"Anna Berger", "pro", "Salzburg"}, "re-snapshot, unchanged"},
	{303, "2026-03-01", "c", "C1004", []string{"Liam Novak", "basic", "Wien"}, "Liam signs up"},
	{400, "2026-04-01", "d", "C1004", nil, "Liam is deleted"},
	{500, "2026-05-01", "c", "C1004", []string{"Liam Novak", "team", "Wien"}, "Liam comes back"},
}

// demoLate arrives after the rest has been applied, though it happened earlier.
var demoLate = demoEvent{250, "2026-02-10", "u", "C1002", []string{"Marko Horvat", "pro", "Graz"}, "late: Marko's upgrade on 2026-02-10"}

func (e demoEvent) record() *kgo.Record {
	at, _ := time.Parse("2006-01-02", e.day)
	env := map[string]any{"op": e.op, "ts_ms": at.UnixMilli(), "source": map[string]any{"lsn": e.lsn, "ts_ms": at.UnixMilli()}}
	key := map[string]any{"customer_id": e.id}
	if e.row != nil {
		env["after"] = map[string]any{"customer_id": e.id, "name": e.row[0], "plan": e.row[1], "city": e.row[2]}
	} else {
		env["before"] = key
	}
	k, _ := json.Marshal(key)
	v, _ := json.Marshal(env)
	return &kgo.Record{Topic: demoTopic, Key: k, Value: v}
}

// runDemo plays the scripted scenario through the real run path, on an
// in-process Kafka (kfake) and a throwaway PostgreSQL, and prints the history.
func runDemo(ctx context.Context, out io.Writer) error {
	fmt.Fprintln(out, "Starting a throwaway PostgreSQL and an in-process Kafka ...")
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return fmt.Errorf("demo needs PostgreSQL: %w", err)
	}
	defer pg.Stop()
	fmt.Fprintf(out, "PostgreSQL: %s\n", pg.Kind)
	dsn, err := pg.CreateDatabase(ctx, "scd2sink_demo")
	if err != nil {
		return err
	}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, demoTopic))
	if err != nil {
		return fmt.Errorf("starting in-process Kafka: %w", err)
	}
	defer kafka.Close()

	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka:
  brokers: %s
postgres:
  dsn: %q
sequencer:
  reorder_window: 200ms
sink:
  batch_max_wait: 50ms
http:
  addr: ""
tables:
  - topic: %s
    target: customers_history
    keys: [customer_id]
    track_history: [plan, city]
`, brokers, dsn, demoTopic)), func(string) (string, bool) { return "", false })
	if err != nil {
		return err
	}
	log := zap.New(zapcore.NewNopCore())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- app.Run(runCtx, cfg, app.Options{Logger: log}) }()

	producer, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		stop()
		return err
	}
	defer producer.Close()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		stop()
		return err
	}
	defer pool.Close()
	fmt.Fprintln(out, "\nPlaying the change events (Debezium JSON on topic "+demoTopic+"):")
	send := func(evs ...demoEvent) error {
		for _, e := range evs {
			fmt.Fprintf(out, "  lsn %d  %s  op=%s  %s  %s\n", e.lsn, e.day, e.op, e.id, e.note)
			if err := producer.ProduceSync(ctx, e.record()).FirstErr(); err != nil {
				return err
			}
		}
		return nil
	}
	produced := int64(0)
	for _, step := range [][]demoEvent{demoScript, {demoLate}} {
		if err := send(step...); err != nil {
			stop()
			return err
		}
		produced += int64(len(step))
		if err := waitOffsets(ctx, pool, produced); err != nil {
			stop()
			return err
		}
	}
	stop()
	if err := <-done; err != nil {
		return err
	}
	return printHistory(ctx, out, pool)
}

func waitOffsets(ctx context.Context, pool *pgxpool.Pool, n int64) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var got int64
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets`).Scan(&got)
		if err == nil && got >= n {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("demo: events were not applied within a minute")
}

func printHistory(ctx context.Context, out io.Writer, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT customer_id, name, plan, city, to_char(valid_from AT TIME ZONE 'UTC', 'YYYY-MM-DD'),
		coalesce(to_char(valid_to AT TIME ZONE 'UTC', 'YYYY-MM-DD'), ''), is_current
		FROM customers_history ORDER BY customer_id, scd_seq`)
	if err != nil {
		return err
	}
	defer rows.Close()
	fmt.Fprintln(out, "\nThe history table customers_history:")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "customer_id\tname\tplan\tcity\tvalid_from\tvalid_to\tis_current")
	for rows.Next() {
		var id, name, plan, city, from, to string
		var cur bool
		if err := rows.Scan(&id, &name, &plan, &city, &from, &to, &cur); err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%v\n", id, name, plan, city, from, to, cur)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	tw.Flush()
	const q = `SELECT plan FROM customers_history WHERE customer_id = 'C1001'
  AND valid_from <= '2026-02-15' AND (valid_to IS NULL OR '2026-02-15' < valid_to)`
	var plan string
	if err := pool.QueryRow(ctx, q).Scan(&plan); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nWhich plan did C1001 have on 2026-02-15?\n  %s\n  -> %s\n", q, plan)
	return nil
}
