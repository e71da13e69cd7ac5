package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkSoak runs the real binary under a steady load for a long time
// and watches its memory: SOAK_TABLES tables (20) of two partitions each,
// SOAK_RATE changes a second (3,000) of scdtest.Soak (creates, tracked
// and Type 1 updates, deletes with tombstones, re-creates; new keys all
// the time, or SOAK_KEYS keys per table), 2 % of them produced 3 s late
// (after their key's later changes: repaired), 0.1 % twice, and one
// undecodable record a minute, for SOAK_MINUTES (3; the soak is
// 60). The reorder window is the default 2 s. Every 10 s it samples the
// binary's resident set (VmRSS), the heap in use and its CPU; records the
// binary applied are deleted from the in-process Kafka as a broker's
// retention would. It reports the resident set at the end of the warm-up
// (SOAK_WARMUP_MINUTES, a sixth of the run by default), the highest after
// it and their ratio (the goal: within 10 %), and the binary's CPU per
// change after the warm-up. Before the steady load, SOAK_BACKLOG_SECONDS
// (30; 0: none) of the same stream are produced at once and a binary
// started over them: its CPU per change through that backlog (from
// /healthz on) is the full-speed figure of the same workload, and the
// steady one, in a binary started afresh, is reported against it (the
// goal: within 1.5). The steady load then starts over the backlog's keys
// and history: set SOAK_BACKLOG_SECONDS=0 to compare with runs before it.
// After the steady load, SOAK_TAIL_SECONDS (30; 0: none) more of the
// stream are produced at once and a new binary started over them: the
// full-speed figure of the steady load's own mix of keys and history.
func BenchmarkSoak(b *testing.B) {
	minutes, tables, rate, fixed := envInt("SOAK_MINUTES", 3), envInt("SOAK_TABLES", 20), envInt("SOAK_RATE", 3000), envInt("SOAK_KEYS", 0)
	warm := time.Duration(envInt("SOAK_WARMUP_MINUTES", 0)) * time.Minute
	if warm == 0 {
		warm = time.Duration(minutes) * time.Minute / 6
	}
	ctx := context.Background()
	for iter := 0; iter < b.N; iter++ {
		soak := scdtest.NewSoak(rand.New(rand.NewPCG(7, 8)), tables, fixed)
		var topics []string
		for _, s := range soak.Sources() {
			topics = append(topics, s.Topic())
		}
		kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topics...),
			// Trimming frees whole segments only: 8 MiB ones, not 100 MiB per partition.
			kfake.BrokerConfigs(map[string]string{"log.segment.bytes": strconv.Itoa(8 << 20)}))
		if err != nil {
			b.Fatal(err)
		}
		dsn := pgtest.NewDatabase(b)
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		httpAddr := freeAddr(b)
		cfgFile := filepath.Join(b.TempDir(), "scd2sink.yaml")
		if err := os.WriteFile(cfgFile, []byte(soakConfig(kafka.ListenAddrs(), dsn, httpAddr, soak.Sources())), 0o600); err != nil {
			b.Fatal(err)
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
		if err != nil {
			b.Fatal(err)
		}
		adm := kadm.NewClient(cl)
		var produced, garbage int64
		produce := func(r *kgo.Record) {
			produced++
			cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
				if err != nil {
					b.Error(err)
				}
			})
		}
		rng := rand.New(rand.NewPCG(9, 10))
		// The backlog: the same stream, its late changes produced 3 s
		// (of the stream) after their turn.
		backlog := 30 * rate
		if v, err := strconv.Atoi(os.Getenv("SOAK_BACKLOG_SECONDS")); err == nil && v >= 0 { // 0: none
			backlog = v * rate
		}
		// produceBacklog produces n changes of the stream at once, as if
		// they had come at rate up to now, its late changes 3 s (of the
		// stream) after their turn.
		produceBacklog := func(n int) {
			type heldBack struct {
				rec *kgo.Record
				due int
			}
			var lateBacklog []heldBack
			from := time.Now().Add(-time.Duration(n) * time.Second / time.Duration(rate))
			for i := 0; i < n; i++ {
				for len(lateBacklog) > 0 && lateBacklog[0].due <= i {
					produce(lateBacklog[0].rec)
					lateBacklog = lateBacklog[1:]
				}
				for _, w := range soak.Next(from.Add(time.Duration(i) * time.Second / time.Duration(rate))) {
					k, v := w.Src.Envelope(w.Change)
					if w.Tombstone {
						v = nil
					}
					r := &kgo.Record{Topic: w.Src.Topic(), Key: k, Value: v}
					switch x := rng.IntN(1000); {
					case x < 20 && !w.Tombstone:
						lateBacklog = append(lateBacklog, heldBack{r, i + 3*rate})
						continue
					case x == 20:
						produce(&kgo.Record{Topic: r.Topic, Key: k, Value: v})
					}
					produce(r)
				}
			}
			for _, h := range lateBacklog {
				produce(h.rec)
			}
			if err := cl.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
		produceBacklog(backlog)
		// run starts the binary, writing a CPU profile to prof (none: "").
		run := func(prof string) *exec.Cmd {
			cmd := exec.Command(binary(b), "run", "--config", cfgFile)
			cmd.Stderr = os.Stderr
			if prof != "" {
				cmd.Env = append(os.Environ(), "SCD2SINK_CPUPROFILE="+prof)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			for up := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) { // the binary serves /metrics
				if resp, err := http.Get("http://" + httpAddr + "/healthz"); err == nil {
					resp.Body.Close()
					break
				}
				if time.Now().After(up) {
					b.Fatal("the binary did not serve /healthz within a minute")
				}
			}
			return cmd
		}
		prof := os.Getenv("SOAK_CPUPROFILE")
		// throughBacklog starts a binary over a backlog of n changes and
		// returns its CPU per change (µs, from /healthz on) until all is
		// applied; it writes its profile to prof+suffix.
		throughBacklog := func(n int, suffix, what string) float64 {
			p := ""
			if prof != "" {
				p = prof + suffix
			}
			cmd := run(p)
			up := sampleProcess(b, cmd.Process.Pid, "http://"+httpAddr+"/metrics")
			waitApplied(b, pool, produced, 10*time.Minute)
			s := sampleProcess(b, cmd.Process.Pid, "http://"+httpAddr+"/metrics")
			us := (s.cpu - up.cpu) / float64(n) * 1e6
			fmt.Fprintf(os.Stderr, "soak %s: %d changes applied at full speed, %.1f s of CPU, %.0f µs per change, RSS %.0f MiB\n",
				what, n, s.cpu-up.cpu, us, s.rss)
			_ = cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				b.Fatalf("scd2sink: %v", err)
			}
			return us
		}
		var full float64 // µs of CPU per change through the backlog
		if backlog > 0 {
			// Its own process (and profile: SOAK_CPUPROFILE.backlog); the
			// steady load starts a new one, as the hidden soak does: no
			// burst before its warm-up.
			full = throughBacklog(backlog, ".backlog", "backlog")
		}
		cmd := run(prof)
		type held struct {
			rec *kgo.Record
			due time.Time
		}
		var late []held
		start := time.Now()
		end := start.Add(time.Duration(minutes) * time.Minute)
		tick := time.NewTicker(10 * time.Millisecond)
		var samples []soakSample
		nextSample, nextTrim, nextGarbage := start, start.Add(30*time.Second), start.Add(time.Minute)
		var changes float64
		for now := range tick.C {
			if now.After(end) {
				break
			}
			for changes < now.Sub(start).Seconds()*float64(rate) {
				changes++
				for _, w := range soak.Next(now) {
					k, v := w.Src.Envelope(w.Change)
					if w.Tombstone {
						v = nil
					}
					r := &kgo.Record{Topic: w.Src.Topic(), Key: k, Value: v}
					x := rng.IntN(1000)
					if x < 20 && !w.Tombstone {
						late = append(late, held{r, now.Add(3 * time.Second)})
						continue
					}
					if x == 20 {
						produce(&kgo.Record{Topic: r.Topic, Key: k, Value: v})
					}
					produce(r)
				}
			}
			for len(late) > 0 && !late[0].due.After(now) {
				produce(late[0].rec)
				late = late[1:]
			}
			if !now.Before(nextGarbage) {
				nextGarbage = nextGarbage.Add(time.Minute)
				garbage++
				produce(&kgo.Record{Topic: topics[rng.IntN(len(topics))], Key: []byte(`{"id":1}`), Value: []byte(`{"schema":{"type":"struct"},"payload":{"op":`)})
			}
			if !now.Before(nextTrim) {
				nextTrim = nextTrim.Add(30 * time.Second)
				soakTrim(ctx, adm)
			}
			if !now.Before(nextSample) {
				nextSample = nextSample.Add(10 * time.Second)
				s := sampleProcess(b, cmd.Process.Pid, "http://"+httpAddr+"/metrics")
				s.at, s.changes = now.Sub(start), int64(changes)
				samples = append(samples, s)
				fmt.Fprintf(os.Stderr, "soak %s: %d changes, RSS %.0f MiB, heap in use %.0f MiB, CPU %.1f s, %.0f goroutines\n",
					s.at.Round(time.Second), s.changes, s.rss, s.heap, s.cpu, s.goroutines)
			}
		}
		tick.Stop()
		for _, h := range late {
			produce(h.rec)
		}
		if err := cl.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		waitApplied(b, pool, produced, 3*time.Minute)
		m := scrape(b, "http://"+httpAddr+"/metrics", "scd2sink_batch_apply_seconds_sum", "scd2sink_batch_apply_seconds_count")
		b.Logf("%.0f batch transactions, %.1f ms each on average", m["scd2sink_batch_apply_seconds_count"],
			1000*m["scd2sink_batch_apply_seconds_sum"]/max(1, m["scd2sink_batch_apply_seconds_count"]))
		var dead int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_dead_letters`).Scan(&dead); err != nil {
			b.Fatal(err)
		}
		if dead < garbage {
			b.Errorf("%d dead letters, want at least the %d undecodable records", dead, garbage)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("scd2sink: %v", err)
		}
		// The tail: the stream goes on while no binary runs, then one
		// starts over it. Its keys and history are the steady load's, so
		// its CPU per change is the full-speed figure of the steady mix
		// (the first backlog's keys are new: mostly creates of keys
		// whose later changes fold in memory in the same batch).
		var tail float64
		tailN := 30 * rate
		if v, err := strconv.Atoi(os.Getenv("SOAK_TAIL_SECONDS")); err == nil && v >= 0 { // 0: none
			tailN = v * rate
		}
		if tailN > 0 {
			// Its changes are timed after the steady load's last ones.
			time.Sleep(time.Until(end.Add(time.Duration(tailN) * time.Second / time.Duration(rate))))
			produceBacklog(tailN)
			tail = throughBacklog(tailN, ".tail", "tail")
		}
		cl.Close()
		pool.Close()
		kafka.Close()
		steady := reportSoak(b, samples, warm)
		if full > 0 {
			b.ReportMetric(full, "full_cpu_us/change")
			b.ReportMetric(steady/full, "steady/full_cpu")
			b.Logf("CPU per change: %.0f µs at %d changes/s against %.0f µs through the backlog at full speed (%.2fx)", steady, rate, full, steady/full)
		}
		if tail > 0 {
			b.ReportMetric(tail, "tail_cpu_us/change")
			b.ReportMetric(steady/tail, "steady/tail_cpu")
			b.Logf("CPU per change: %.0f µs at %d changes/s against %.0f µs through the tail backlog at full speed (%.2fx)", steady, rate, tail, steady/tail)
		}
	}
}

// soakConfig is the binary's configuration for the soak's tables.
func soakConfig(brokers []string, dsn, httpAddr string, srcs []*scdtest.Source) string {
	bs, _ := json.Marshal(brokers)
	tracked, _ := json.Marshal(scdtest.BenchTracked["customers"])
	cfg := fmt.Sprintf("kafka: {brokers: %s, group_id: bench}\npostgres: {dsn: %q}\nhttp: {addr: %q}\nlog: {level: warn}\ntables:\n", bs, dsn, httpAddr)
	for _, s := range srcs {
		cfg += fmt.Sprintf("  - {topic: %s, target: %s_history, keys: [id], format: debezium-json, track_history: %s}\n", s.Topic(), s.Table, tracked)
	}
	return cfg
}

// soakTrim deletes what the group committed, as retention would.
func soakTrim(ctx context.Context, adm *kadm.Client) {
	offs, err := adm.FetchOffsets(ctx, "bench")
	if err != nil {
		return
	}
	to := kadm.Offsets{}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At > 0 {
			to.AddOffset(o.Topic, o.Partition, o.At, -1)
		}
	})
	_, _ = adm.DeleteRecords(ctx, to)
}

// soakSample is one look at the binary.
type soakSample struct {
	at              time.Duration
	changes         int64
	rss, heap, cpu  float64 // MiB, MiB, seconds
	goroutines      float64
	heapSys, heapRe float64 // MiB: from the OS, and returned to it
}

// sampleProcess reads the binary's resident set and CPU from /proc and
// its heap from /metrics.
func sampleProcess(tb testing.TB, pid int, metrics string) soakSample {
	var s soakSample
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(st), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				s.rss = kb / 1024
			}
		}
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if i := strings.LastIndexByte(string(st), ')'); i > 0 {
			f := strings.Fields(string(st[i+1:]))
			ut, _ := strconv.ParseFloat(f[11], 64)
			stime, _ := strconv.ParseFloat(f[12], 64)
			s.cpu = (ut + stime) / 100 // USER_HZ
		}
	}
	m, err := tryScrape(metrics, "go_memstats_heap_inuse_bytes", "go_goroutines", "go_memstats_heap_sys_bytes", "go_memstats_heap_released_bytes")
	if err != nil { // one missed look does not end an hour's run
		tb.Logf("sample at %s: %v", time.Now().Format(time.TimeOnly), err)
	}
	s.heap, s.goroutines = m["go_memstats_heap_inuse_bytes"]/(1<<20), m["go_goroutines"]
	s.heapSys, s.heapRe = m["go_memstats_heap_sys_bytes"]/(1<<20), m["go_memstats_heap_released_bytes"]/(1<<20)
	return s
}

// reportSoak reports the resident set after the warm-up against its
// highest since, and the CPU per change after the warm-up, which it
// returns (µs).
func reportSoak(b *testing.B, samples []soakSample, warm time.Duration) float64 {
	b.Helper()
	var at *soakSample
	for i := range samples {
		if samples[i].at >= warm {
			at = &samples[i]
			break
		}
	}
	if at == nil || at == &samples[len(samples)-1] {
		b.Fatalf("the run ended before the warm-up (%s) did", warm)
	}
	last := samples[len(samples)-1]
	peak, heapPeak := at.rss, at.heap
	for _, s := range samples {
		if s.at >= warm {
			peak, heapPeak = max(peak, s.rss), max(heapPeak, s.heap)
		}
	}
	cpu := (last.cpu - at.cpu) / float64(last.changes-at.changes) * 1e6
	b.ReportMetric(at.rss, "rss_warm_MiB")
	b.ReportMetric(peak, "rss_peak_MiB")
	b.ReportMetric(last.rss, "rss_end_MiB")
	b.ReportMetric(peak/at.rss, "rss_peak/warm")
	b.ReportMetric(cpu, "cpu_us/change")
	b.Logf("after the %s warm-up: RSS %.0f MiB, then at most %.0f MiB (%.2f), at the end %.0f MiB; heap in use %.0f -> at most %.0f MiB; %.0f µs of CPU per change; %d changes",
		warm, at.rss, peak, peak/at.rss, last.rss, at.heap, heapPeak, cpu, last.changes)
	return cpu
}
