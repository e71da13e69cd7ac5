package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
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

// demoSnapshot, demoFix and demoScript are played in turn, each shown
// with what it did to the history; demoLate comes last.
var demoSnapshot = []demoEvent{
	{100, "2026-01-01", "r", "C1001", []string{"Sara Meier", "basic", "Wien"}, "snapshot"},
	{101, "2026-01-01", "r", "C1002", []string{"Marko Horvat", "basic", "Graz"}, "snapshot"},
	{102, "2026-01-01", "r", "C1003", []string{"Anna Berger", "pro", "Salzburg"}, "snapshot"},
}

var demoFix = []demoEvent{
	{200, "2026-02-01", "u", "C1001", []string{"Sarah Meier", "basic", "Wien"}, "typo in the name fixed: name is not tracked, so no new version (Type 1)"},
}

var demoScript = []demoEvent{
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

// demoConfig is the configuration the demo runs; %s are the brokers, the
// DSN, the topic and the status page's address.
const demoConfig = `kafka:
  brokers: %s
postgres:
  dsn: %q
sequencer:
  reorder_window: 200ms
sink:
  batch_max_wait: 50ms
http:
  addr: %q
tables:
  - topic: %s
    target: customers_history
    keys: [customer_id]
    # A change to plan or city closes the current version and opens a new
    # one; a change to any other column (name) is corrected in place in
    # the key's versions (Type 1): no new version.
    track_history: [plan, city]
`

// runDemo plays the scripted scenario through the real run path, on an
// in-process Kafka (kfake) and a throwaway PostgreSQL, and prints the
// configuration, each step and the history. With serve it then keeps
// the service running, its status page and /metrics on a loopback port,
// until ctx ends.
func runDemo(ctx context.Context, out io.Writer, serve bool) error {
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
	addr, err := loopbackAddr()
	if err != nil {
		return err
	}
	text := fmt.Sprintf(demoConfig, brokers, dsn, addr, demoTopic)
	cfg, err := config.Parse([]byte(text), func(string) (string, bool) { return "", false })
	if err != nil {
		return err
	}
	cfgFile, err := writeDemoConfig(text)
	if err != nil {
		return err
	}
	defer os.Remove(cfgFile)
	fmt.Fprintf(out, "\nThe configuration (%s):\n%s", cfgFile, indent(text))
	log := zap.New(zapcore.NewNopCore())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- app.Run(runCtx, cfg, app.Options{Logger: log, ConfigPath: cfgFile, Version: moduleVersion()})
	}()

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
	for i, step := range [][]demoEvent{demoSnapshot, demoFix, demoScript, {demoLate}} {
		if err := send(step...); err != nil {
			stop()
			return err
		}
		produced += int64(len(step))
		if err := waitOffsets(ctx, pool, produced); err != nil {
			stop()
			return err
		}
		if i < 2 { // the snapshot, then the fix: C1001's one version, its name corrected in place
			if err := printVersions(ctx, out, pool, "C1001"); err != nil {
				stop()
				return err
			}
		}
	}
	if err := printHistory(ctx, out, pool); err != nil {
		stop()
		return err
	}
	if serve {
		fmt.Fprintf(out, "\nThe service keeps running. Try:\n"+
			"  the status page     http://%[1]s/\n"+
			"  its metrics         http://%[1]s/metrics\n"+
			"  the history         psql '%[2]s' -c 'SELECT * FROM customers_history'\n"+
			"  one key             scd2sink history --config %[3]s --table customers_history --key C1002\n"+
			"  what needs doing    scd2sink status --config %[3]s\n"+
			"Ctrl-C stops it and removes the throwaway PostgreSQL.\n", addr, dsn, cfgFile)
		select {
		case <-ctx.Done():
		case err := <-done: // the service stopped by itself (its port taken since): say why
			stop()
			return fmt.Errorf("the demo's service stopped: %w", err)
		}
	}
	stop()
	return <-done
}

// loopbackAddr is a free port on the loopback interface.
func loopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port for the status page: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// writeDemoConfig writes the demo's configuration to a file the other
// commands can be pointed at while it runs.
func writeDemoConfig(text string) (string, error) {
	f, err := os.CreateTemp("", "scd2sink-demo-*.yaml")
	if err != nil {
		return "", fmt.Errorf("writing the demo's configuration: %w", err)
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return "", fmt.Errorf("writing the demo's configuration: %w", err)
	}
	return f.Name(), f.Close()
}

func indent(text string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(text, "\n"), "\n", "\n  ") + "\n"
}

// printVersions prints a key's versions after a step.
func printVersions(ctx context.Context, out io.Writer, pool *pgxpool.Pool, id string) error {
	rows, err := pool.Query(ctx, `SELECT name, plan, city, to_char(valid_from AT TIME ZONE 'UTC', 'YYYY-MM-DD'), is_current
		FROM customers_history WHERE customer_id = $1 ORDER BY scd_seq`, id)
	if err != nil {
		return err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var name, plan, city, from string
		var cur bool
		if err := rows.Scan(&name, &plan, &city, &from, &cur); err != nil {
			return err
		}
		n++
		fmt.Fprintf(out, "    -> %s version %d: name=%q plan=%s city=%s valid_from=%s is_current=%v\n", id, n, name, plan, city, from, cur)
	}
	return rows.Err()
}

// waitOffsets waits until n records are applied, a minute at most, or
// until ctx ends (Ctrl-C).
func waitOffsets(ctx context.Context, pool *pgxpool.Pool, n int64) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		var got int64
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM scd2sink_offsets`).Scan(&got)
		if err == nil && got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
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
	const q = `SELECT plan FROM customers_history_as_of('2026-02-15') WHERE customer_id = 'C1001'`
	var plan string
	if err := pool.QueryRow(ctx, q).Scan(&plan); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nWhich plan did C1001 have on 2026-02-15?\n  %s\n  -> %s\n", q, plan)
	return nil
}
