//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
)

// The live phase's sinks: Debezium's JDBC sink as this connector (its
// consumer group connect-<name>, its database jdbc_live), scd2sink in this
// consumer group (its database mixhist_live).
const (
	liveConnector = "jdbc-mix-live"
	liveGroup     = "scd2sink-live"
)

// liveSide is one sink of the live phase: how far it has read the mixed
// topics, how far behind the source its database is, and how it stops.
type liveSide struct {
	name string
	// ready waits until the sink runs and has joined its group.
	ready func()
	// progress is, per partition of the mixed topics (partKey), the next
	// offset the sink has committed or applied.
	progress func() (map[string]int64, error)
	// lag is now less the newest source time the sink's database shows,
	// when that time is at or after since (false: no sample).
	lag  func(since time.Time) (time.Duration, bool)
	tail func() string // the sink's log, for failures
	stop func()
}

// liveResult is one side's live phase.
type liveResult struct {
	changes  int             // the load's source changes
	load     time.Duration   // the CALL: from its start to its last commit
	lags     []time.Duration // the samples a second apart while the load ran, sorted
	caughtUp time.Duration   // from the CALL's return until the sink had every record
}

// rate is the changes a second the source produced.
func (r liveResult) rate() float64 { return float64(r.changes) / r.load.Seconds() }

// lag is the nearest-rank p-th percentile (0 < p <= 100) of the samples,
// in seconds; NaN without samples.
func (r liveResult) lag(p float64) float64 {
	if len(r.lags) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(r.lags)))) - 1
	return r.lags[min(max(i, 0), len(r.lags)-1)].Seconds()
}

// runMixLive is the mixed benchmark's live phase: for Debezium's JDBC
// sink, then for scd2sink, each alone, the sink starts at the topics' end,
// then CALL mix_load(per, 10, rate) runs on the source (paced at rate
// changes a second) while the end-to-end lag is sampled every second,
// until the sink has read every record the load produced. It logs each side's lag, how long after the load's last commit
// the sink had everything, and the source's rate; scd2sink's history is
// checked as runMixOurs checks it.
func runMixLive(t *testing.T, ctx context.Context, st *stack, adm *kadm.Client, per, rate int) {
	t.Helper()
	jdbc := liveJDBC(t, ctx, st, adm)
	peer := runLive(t, ctx, st, adm, jdbc, per, rate)
	jdbc.stop()
	sink, pool := liveOurs(t, ctx, st)
	ours := runLive(t, ctx, st, adm, sink, per, rate)
	sink.stop()
	if _, err := adm.DeleteGroup(ctx, liveGroup); err != nil {
		t.Logf("forgetting %s's consumer group: %v", liveGroup, err)
	}
	for i := range mixedTables {
		var keys, current int64
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(DISTINCT id) FILTER (WHERE id > 0), count(*) FILTER (WHERE is_current) FROM mix_%d_history`, i)).Scan(&keys, &current); err != nil {
			t.Fatalf("reading mix_%d_history of the live phase: %v", i, err)
		}
		if keys != int64(per) || current != 0 {
			t.Errorf("live: mix_%d_history: %d keys (want %d), %d current (every row was deleted: want 0)", i, keys, per, current)
		}
	}
	t.Logf("live phase, JDBC sink / scd2sink: lag p50 %.2f / %.2f s, p99 %.2f / %.2f s, max %.2f / %.2f s; caught up %.1f / %.1f s after the load's last commit; source %.0f / %.0f changes/s",
		peer.lag(50), ours.lag(50), peer.lag(99), ours.lag(99), peer.lag(100), ours.lag(100),
		peer.caughtUp.Seconds(), ours.caughtUp.Seconds(), peer.rate(), ours.rate())
}

// runLive places the sink at the topics' end (positionLive), runs the
// load with per inserts a table, samples the lag every second while it
// runs, and waits until the sink has read every record the load produced:
// each partition's progress at its end, which holds exactly the load's
// records more than where the sink stood before it.
func runLive(t *testing.T, ctx context.Context, st *stack, adm *kadm.Client, side *liveSide, per, rate int) liveResult {
	t.Helper()
	side.ready()
	start := positionLive(t, ctx, st, adm, side)
	r := liveResult{changes: per * mixedTables * 5} // inserts + 3 updates and a delete per insert
	want := total(start) + int64(per*mixedTables*6) // every delete is followed by its tombstone
	type returned struct {
		err error
		at  time.Time // the CALL's return: its last commit
	}
	loaded := make(chan returned, 1)
	began := time.Now()
	go func() {
		_, err := st.src.pool.Exec(ctx, fmt.Sprintf(`CALL mix_load(%d, %d, %d)`, per, mixedTables, rate), pgx.QueryExecModeSimpleProtocol)
		loaded <- returned{err, time.Now()}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var ended time.Time
	for ended.IsZero() {
		select {
		case ret := <-loaded:
			if ret.err != nil {
				t.Fatalf("live load: %v", ret.err)
			}
			ended, r.load = ret.at, ret.at.Sub(began)
		case <-tick.C:
			if len(loaded) > 0 {
				continue // the load has returned: no more samples
			}
			if lag, ok := side.lag(began); ok { // the load's first changes are in
				r.lags = append(r.lags, lag)
			}
		}
	}
	var ends map[string]int64
	if err := waitFor(ctx, 20*time.Minute, func() (bool, error) {
		var err error
		if ends, err = partitionEnds(ctx, adm); err != nil || total(ends) < want {
			return false, err
		}
		got, err := side.progress()
		return covers(got, ends), err
	}); err != nil {
		got, _ := side.progress()
		t.Fatalf("live: %s did not read every record of the load (ends %v, read to %v): %v\n%s", side.name, ends, got, err, side.tail())
	}
	r.caughtUp = time.Since(ended)
	if n := total(ends); n != want {
		t.Errorf("live: the topics grew by %d records during the load, want %d", n-total(start), want-total(start))
	}
	slices.Sort(r.lags)
	t.Logf("live: %s: %d changes from the source in %v = %.0f changes/s; lag p50 %.2f s, p99 %.2f s, max %.2f s (%d samples a second apart); caught up %.1f s after the load's last commit",
		side.name, r.changes, r.load.Round(time.Millisecond), r.rate(), r.lag(50), r.lag(99), r.lag(100), len(r.lags), r.caughtUp.Seconds())
	return r
}

// positionLive makes sure that the sink reads the mixed topics from here
// on. Neither sink commits anything before it has read a record, so a
// probe (a row of id 0 inserted and deleted in each table, in one
// transaction: three records a topic) is written, and the sink must read
// every partition up to its end after the probe. A sink placed after the
// probe's records (its group still settling) has not: the probe is written
// again. It returns each partition's end offset, where the sink now
// stands; the mixed topics have one partition each.
func positionLive(t *testing.T, ctx context.Context, st *stack, adm *kadm.Client, side *liveSide) map[string]int64 {
	t.Helper()
	var probe strings.Builder
	for i := range mixedTables {
		fmt.Fprintf(&probe, `INSERT INTO mix_%[1]d VALUES (0, 'probe', 'probe', 0, now(), ''); DELETE FROM mix_%[1]d WHERE id = 0;`, i)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for n := 1; ; n++ {
		before, err := partitionEnds(ctx, adm)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.src.pool.Exec(ctx, probe.String(), pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("live: writing probe %d: %v", n, err)
		}
		var ends map[string]int64
		if err := waitFor(ctx, time.Minute, func() (bool, error) {
			var err error
			ends, err = partitionEnds(ctx, adm)
			return err == nil && total(ends) >= total(before)+3*mixedTables, err
		}); err != nil {
			t.Fatalf("live: Debezium did not publish probe %d: %v\n%s", n, err, st.conn.proc.tail(20))
		}
		if len(ends) != mixedTables {
			t.Fatalf("live: the mixed topics have %d partitions, want one a topic", len(ends))
		}
		err = waitFor(ctx, 15*time.Second, func() (bool, error) {
			got, err := side.progress()
			return covers(got, ends), err
		})
		if err == nil {
			return ends
		}
		if time.Now().After(deadline) {
			t.Fatalf("live: %s never read the probes to the topics' end: %v\n%s", side.name, err, side.tail())
		}
		t.Logf("live: %s has not read probe %d to the topics' end (%v); writing it again", side.name, n, err)
	}
}

// liveJDBC registers Debezium's JDBC sink as in runMixJDBC, into a new
// database (jdbc_live), its consumer starting at the topics' end
// (auto.offset.reset latest: its group connect-<name> has no offsets).
func liveJDBC(t *testing.T, ctx context.Context, st *stack, adm *kadm.Client) *liveSide {
	t.Helper()
	_, pool := benchDatabase(t, ctx, st, "jdbc_live")
	cfg := fmt.Sprintf(`{"connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector", "tasks.max": "1",
		"topics.regex": "shop\\.public\\.mix_.*", "connection.url": "jdbc:postgresql://127.0.0.1:%s/jdbc_live", "connection.username": "postgres",
		"connection.password": "unused", "insert.mode": "upsert", "primary.key.mode": "record_key", "delete.enabled": "true",
		"schema.evolution": "basic", "batch.size": "2000", "consumer.override.max.poll.records": "2000",
		"consumer.override.auto.offset.reset": "latest"}`, portOf(st.targetDSN))
	u := fmt.Sprintf("http://127.0.0.1:%d/connectors/%s", st.conn.rest, liveConnector)
	group := "connect-" + liveConnector
	tail := func() string { return st.conn.proc.tail(30) }
	if err := restCall(http.MethodPut, u+"/config", cfg); err != nil {
		t.Fatalf("registering %s: %v\n%s", liveConnector, err, tail())
	}
	var query string // the lag query, once the sink has created every table
	return &liveSide{
		name: "Debezium JDBC sink 3.6.0 (upsert, latest row)",
		ready: func() {
			t.Helper()
			if err := waitFor(ctx, 2*time.Minute, func() (bool, error) { return connectorRunning(u) }); err != nil {
				t.Fatalf("live: %s never ran: %v\n%s", liveConnector, err, tail())
			}
			// Best effort: the probes decide whether its consumer is placed.
			if err := waitFor(ctx, time.Minute, func() (bool, error) {
				groups, err := adm.DescribeGroups(ctx, group)
				if err != nil {
					return false, err
				}
				g := groups[group]
				assigned := 0
				for topic, parts := range g.AssignedPartitions() {
					if isMixTopic(topic) {
						assigned += len(parts)
					}
				}
				return g.State == "Stable" && assigned == mixedTables, g.Err
			}); err != nil {
				t.Logf("live: %s's group is not seen stable with the topics assigned (%v); probing anyway", group, err)
			}
		},
		progress: func() (map[string]int64, error) {
			offs, err := adm.FetchOffsets(ctx, group)
			if err != nil {
				return nil, fmt.Errorf("fetching %s's offsets: %w", group, err)
			}
			got := map[string]int64{}
			offs.Each(func(o kadm.OffsetResponse) {
				if o.Err == nil && isMixTopic(o.Topic) {
					got[partKey(o.Topic, o.Partition)] = o.At
				}
			})
			return got, nil
		},
		lag: func(since time.Time) (time.Duration, bool) {
			if query == "" {
				if query = jdbcLagQuery(ctx, pool); query == "" {
					return 0, false
				}
			}
			return sampleLag(ctx, pool, query, since)
		},
		tail: tail,
		stop: func() {
			if err := restCall(http.MethodDelete, u, ""); err != nil {
				t.Logf("removing %s: %v", liveConnector, err)
			}
		},
	}
}

// liveOurs starts scd2sink over the mixed topics into a new database
// (mixhist_live), in a new consumer group starting at the topics' end
// (start_offset: latest). It returns the side and a pool on its database.
func liveOurs(t *testing.T, ctx context.Context, st *stack) (*liveSide, *pgxpool.Pool) {
	t.Helper()
	dsn, pool := benchDatabase(t, ctx, st, "mixhist_live")
	const name = "scd2sink-mix-live"
	p := runSinkKafka(t, st.dir, name, st.kafka.addr(), dsn, "  group_id: "+liveGroup+"\n  start_offset: latest\n", mixTablesYAML)
	tail := func() string { return p.tail(20) }
	var query strings.Builder
	query.WriteString(`SELECT extract(epoch FROM now() - max(ts))::float8 FROM (`)
	for i := range mixedTables {
		if i > 0 {
			query.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&query, `SELECT max(greatest(valid_from, coalesce(valid_to, valid_from))) AS ts FROM mix_%d_history`, i)
	}
	query.WriteString(`) m HAVING max(ts) >= $1`)
	return &liveSide{
		name: "scd2sink (SCD2 history)",
		ready: func() {
			t.Helper()
			addr := sinkHTTPAddr(t, st.dir, name)
			// Best effort: the probes decide whether its consumer is placed.
			if err := waitFor(ctx, time.Minute, func() (bool, error) {
				if p.exited() {
					return true, nil
				}
				resp, err := http.Get("http://" + addr + "/readyz")
				if err != nil {
					return false, err
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK, nil
			}); err != nil {
				t.Logf("live: %s is not ready (%v); probing anyway", name, err)
			}
			if p.exited() {
				t.Fatalf("live: %s exited:\n%s", name, tail())
			}
		},
		progress: func() (map[string]int64, error) {
			rows, err := pool.Query(ctx, `SELECT topic, partition, next_offset FROM scd2sink_offsets WHERE consumer_group = $1 AND topic LIKE 'shop.public.mix_%'`, liveGroup)
			if err != nil {
				return nil, fmt.Errorf("reading scd2sink_offsets: %w", err)
			}
			got := map[string]int64{}
			var topic string
			var part int32
			var next int64
			_, err = pgx.ForEachRow(rows, []any{&topic, &part, &next}, func() error {
				got[partKey(topic, part)] = next
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("reading scd2sink_offsets: %w", err)
			}
			return got, nil
		},
		lag:  func(since time.Time) (time.Duration, bool) { return sampleLag(ctx, pool, query.String(), since) },
		tail: tail,
		stop: func() { p.stop(30 * time.Second) },
	}, pool
}

// jdbcLagQuery is the JDBC sink's lag query over the tables it created
// (those of its database with an updated_at column), in one round trip;
// "" until it has created one for each mixed topic.
func jdbcLagQuery(ctx context.Context, pool *pgxpool.Pool) string {
	rows, err := pool.Query(ctx, `SELECT table_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND column_name = 'updated_at' ORDER BY table_name`)
	if err != nil {
		return ""
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) < mixedTables {
		return ""
	}
	parts := make([]string, len(names))
	for i, n := range names { // updated_at is a cast no-op if it is timestamptz already
		parts[i] = fmt.Sprintf(`SELECT max(updated_at::timestamptz) AS ts FROM %s`, pgx.Identifier{n}.Sanitize())
	}
	return `SELECT extract(epoch FROM now() - max(ts))::float8 FROM (` + strings.Join(parts, " UNION ALL ") + `) m HAVING max(ts) >= $1`
}

// sampleLag runs a lag query; no sample when it fails (a table not there
// yet) or when the newest time is before since.
func sampleLag(ctx context.Context, pool *pgxpool.Pool, query string, since time.Time) (time.Duration, bool) {
	var secs float64
	if err := pool.QueryRow(ctx, query, since).Scan(&secs); err != nil {
		return 0, false
	}
	return time.Duration(secs * float64(time.Second)), true
}

// connectorRunning asks Connect's REST API (u is the connector's URL)
// whether the connector and all its tasks run; a failed task is an error.
func connectorRunning(u string) (bool, error) {
	resp, err := http.Get(u + "/status")
	if err != nil {
		return false, fmt.Errorf("connector status: %w", err)
	}
	defer resp.Body.Close()
	var s struct {
		Connector struct{ State string } `json:"connector"`
		Tasks     []struct {
			State string `json:"state"`
			Trace string `json:"trace"`
		} `json:"tasks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return false, fmt.Errorf("connector status (%s): %w", resp.Status, err)
	}
	running := s.Connector.State == "RUNNING" && len(s.Tasks) > 0
	for _, task := range s.Tasks {
		if task.State == "FAILED" {
			return false, fmt.Errorf("a task failed: %s", task.Trace)
		}
		running = running && task.State == "RUNNING"
	}
	return running, nil
}

// restCall sends a request with a JSON body (none if empty) to Connect's
// REST API; an answer of 300 or more is an error.
func restCall(method, u, body string) error {
	req, err := http.NewRequest(method, u, bytes.NewBufferString(body))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, u, err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return fmt.Errorf("%s %s: %s %s", method, u, resp.Status, b.String())
	}
	return nil
}

// sinkHTTPAddr is the http address in the config runSinkTables wrote for
// the scd2sink process name.
func sinkHTTPAddr(t *testing.T, dir, name string) string {
	t.Helper()
	cfg, err := os.ReadFile(filepath.Join(dir, name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`addr: "([^"]+)"`).FindSubmatch(cfg)
	if m == nil {
		t.Fatalf("no http addr in %s's config", name)
	}
	return string(m[1])
}

// partitionEnds is the end offset of each partition of the mixed topics.
func partitionEnds(ctx context.Context, adm *kadm.Client) (map[string]int64, error) {
	ends, err := adm.ListEndOffsets(ctx, mixTopics()...)
	if err != nil {
		return nil, fmt.Errorf("listing the mixed topics' end offsets: %w", err)
	}
	out := map[string]int64{}
	var errs []error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", partKey(o.Topic, o.Partition), o.Err))
			return
		}
		out[partKey(o.Topic, o.Partition)] = o.Offset
	})
	if len(errs) > 0 {
		return nil, fmt.Errorf("listing the mixed topics' end offsets: %w", errors.Join(errs...))
	}
	return out, nil
}

// covers: the sink's progress reaches every partition's end.
func covers(progress, ends map[string]int64) bool {
	for k, end := range ends {
		if progress[k] < end {
			return false
		}
	}
	return true
}

// total is the sum of offsets over partitions.
func total(offsets map[string]int64) int64 {
	var n int64
	for _, o := range offsets {
		n += o
	}
	return n
}

// partKey names a partition in the maps above.
func partKey(topic string, partition int32) string { return fmt.Sprintf("%s/%d", topic, partition) }

// isMixTopic: one of the mixed workload's topics.
func isMixTopic(topic string) bool { return strings.HasPrefix(topic, "shop.public.mix_") }
