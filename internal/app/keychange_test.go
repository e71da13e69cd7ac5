package app

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// A primary-key change as Debezium writes it — the old key's delete and the
// new key's create with the same source.lsn, the create's unchanged TOAST
// column a placeholder — becomes current within the reorder window plus a
// second, whether the two records share a partition or not, and the new
// key takes the old key's value (DESIGN.md section 5).
func TestKeyChangeLatency(t *testing.T) {
	const window = 300 * time.Millisecond
	src := &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "accounts", Keys: []string{"id"}, Cols: []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "plan", Schema: `{"type":"string","optional":true}`},
		{Name: "bio", Schema: `{"type":"string","optional":true}`},
	}}
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, src.Topic()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kafka.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	at := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	lsn := int64(1000)
	record := func(c scdtest.Change, part int32, hdrs ...kgo.RecordHeader) []*kgo.Record {
		lsn++
		if c.LSN == 0 {
			c.LSN = lsn
		}
		c.Commit = at.Add(time.Duration(c.LSN) * time.Second)
		k, v := src.Envelope(c)
		recs := []*kgo.Record{{Topic: src.Topic(), Partition: part, Key: k, Value: v, Headers: hdrs}}
		if c.Op == "d" {
			recs = append(recs, &kgo.Record{Topic: src.Topic(), Partition: part, Key: k})
		}
		return recs
	}
	produce := func(recs []*kgo.Record) {
		t.Helper()
		if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	const n = 6
	for i := 1; i <= n; i++ {
		produce(record(scdtest.Change{Op: "c", After: scdtest.Row{"id": i, "plan": "basic", "bio": fmt.Sprintf("bio %d", i)}}, int32(i%2)))
	}

	dsn := pgtest.NewDatabase(t)
	brokers, _ := json.Marshal(kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s}
postgres: {dsn: %q}
http: {addr: %q}
sequencer: {reorder_window: %s}
sink: {batch_max_wait: 50ms}
tables:
  - topic: %s
    target: accounts_history
`, brokers, dsn, freeAddr(t), window, src.Topic())), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, Options{Logger: zap.NewNop()}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	current := func(id int, within time.Duration) bool {
		deadline := time.Now().Add(within)
		for {
			var ok bool
			err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM accounts_history WHERE id = $1 AND is_current)`, id).Scan(&ok)
			if err == nil && ok {
				return true
			}
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !current(n, 20*time.Second) {
		t.Fatal("the first creates were never applied")
	}
	var worst time.Duration
	for i := 1; i <= n; i++ {
		oldPart, newPart := int32(i%2), int32(i%2)
		if i > n/2 {
			newPart = 1 - oldPart // the new key hashes to the other partition
		}
		lsn++
		same := lsn // one WAL record: one source.lsn for both
		del := record(scdtest.Change{Op: "d", Before: scdtest.Row{"id": i}, LSN: same}, oldPart,
			kgo.RecordHeader{Key: debezium.NewKeyHeader, Value: []byte(fmt.Sprintf(`{"id":%d}`, 100+i))})
		create := record(scdtest.Change{Op: "c", After: scdtest.Row{"id": 100 + i, "plan": "moved", "bio": "__debezium_unavailable_value"}, LSN: same}, newPart,
			kgo.RecordHeader{Key: debezium.OldKeyHeader, Value: []byte(fmt.Sprintf(`{"id":%d}`, i))})
		start := time.Now()
		produce(append(del, create...))
		if !current(100+i, window+time.Second) {
			t.Fatalf("key change %d (partitions %d→%d): the new key was not current within %v", i, oldPart, newPart, window+time.Second)
		}
		took := time.Since(start)
		worst = max(worst, took)
		t.Logf("key change %d (partitions %d→%d): new key current after %v", i, oldPart, newPart, took.Round(time.Millisecond))
	}
	t.Logf("slowest key change: %v (reorder_window %v)", worst.Round(time.Millisecond), window)

	var got string
	if err := pool.QueryRow(context.Background(), `SELECT string_agg(concat_ws('|', id, plan, bio, is_current), ' ' ORDER BY id, scd_seq) FROM accounts_history`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	want := ""
	for i := 1; i <= n; i++ {
		want += fmt.Sprintf("%d|basic|bio %d|f ", i, i)
	}
	for i := 1; i <= n; i++ {
		want += fmt.Sprintf("%d|moved|bio %d|t ", 100+i, i)
	}
	if got+" " != want {
		t.Errorf("history:\n got %s\nwant %s", got, want)
	}
	var gaps int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM accounts_history o JOIN accounts_history c ON c.id = o.id + 100
		WHERE o.valid_to IS DISTINCT FROM c.valid_from`).Scan(&gaps); err != nil || gaps != 0 {
		t.Errorf("%d old keys do not end where their new key starts (%v)", gaps, err)
	}
}
