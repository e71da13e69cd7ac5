package sink_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
)

// TestEraseScale: 1,000 keys of (order_id integer, created_at timestamp)
// erased in one call from a table with 100,000 dead letters, half as
// their decoded values (a JSON array), half as the record's message key
// with its schema (MicroTimestamp: epoch microseconds). Every dead letter
// of the erased keys goes and no other; the dead-letter table is scanned
// once, not once per key (pg_stat_user_tables), and the time is logged.
func TestEraseScale(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 dead letters")
	}
	ctx := context.Background()
	pool := newPool(t)
	const schema = "erase_scale"
	spec := sink.TableSpec{Target: "orders_history", Schema: schema, Keys: []string{"order_id", "created_at"},
		Columns: []sink.Column{{Name: "order_id", Type: "integer"}, {Name: "created_at", Type: "timestamp"}, {Name: "note", Type: "text"}}}
	secret := []byte("0123456789abcdef0123456789abcdef")
	s := newSinkWith(t, pool, sink.Config{Schema: schema, Tables: []sink.TableSpec{spec}, ErasureSecret: secret})
	base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	const keys, letters, erased = 10_000, 100_000, 1_000
	created := func(k int) time.Time { return base.Add(time.Duration(k) * time.Second) }
	var evs []*change.Event
	for k := range keys {
		evs = append(evs, &change.Event{Table: spec.Target, Key: []any{int64(k), created(k)}, Seq: change.MustSeq(k + 1), Op: change.OpCreate,
			ValidFrom: base, After: map[string]any{"order_id": int64(k), "created_at": created(k), "note": "n"}})
	}
	if _, err := s.Apply(ctx, sink.Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	keySchema := `{"type":"struct","fields":[{"type":"int32","optional":false,"field":"order_id"},{"type":"int64","optional":false,"name":"io.debezium.time.MicroTimestamp","version":1,"field":"created_at"}],"optional":false,"name":"shop.public.orders.Key"}`
	rows := make([][]any, letters)
	for i := range letters {
		k := i % keys
		key := fmt.Sprintf(`[%d,%q]`, k, created(k).Format(time.RFC3339Nano))
		decoded := true
		if i%2 == 1 {
			key = fmt.Sprintf(`{"schema":%s,"payload":{"order_id":%d,"created_at":%d}}`, keySchema, k, created(k).UnixMicro())
			decoded = false
		}
		rows[i] = []any{"shop.public.orders", int32(0), int64(i), spec.Target, []byte(key), []byte("not json"), "a test", time.Now(), decoded}
	}
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{schema, "scd2sink_dead_letters"},
		[]string{"topic", "partition", "offset", "target", "key", "value", "error", "created_at", "decoded"}, pgx.CopyFromRows(rows)); err != nil {
		t.Fatal(err)
	}
	var req sink.EraseRequest
	req.Target = spec.Target
	for k := range erased {
		req.Keys = append(req.Keys, []string{fmt.Sprint(k * 7), created(k * 7).Format("2006-01-02 15:04:05")})
	}
	scans := func() (n int64) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'scd2sink_dead_letters'`, schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	time.Sleep(1100 * time.Millisecond) // statistics flush at most once a second
	before := scans()
	start := time.Now()
	res, err := s.Erase(ctx, req)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	// Read once (its rows locked), deleted by id: two scans at most.
	if n := scans() - before; n > 2 {
		t.Errorf("the dead-letter table was scanned %d times for %d keys; want once", n, erased)
	}
	var gone, left, versions int64
	for _, k := range res.Keys {
		gone += k.DeadLetters
		versions += k.Versions
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".scd2sink_dead_letters").Scan(&left); err != nil {
		t.Fatal(err)
	}
	want := int64(erased * letters / keys)
	if gone != want || left != letters-want || versions != erased || len(res.UnreadDeadLetters) != 0 {
		t.Errorf("erased %d dead letters and %d versions, %d left, %d unread; want %d, %d, %d, 0", gone, versions, left, len(res.UnreadDeadLetters), want, erased, letters-want)
	}
	t.Logf("%d keys erased among %d dead letters in %s", erased, letters, took.Round(time.Millisecond))
}

// TestEraseAmbiguousKey: a dead letter's key without a schema
// ({"created_at": 1704067200000}) reads as 2024-01-01 in milliseconds and
// as a time in January 1970 in microseconds. When the table holds a key
// at the second reading too, the dead letter may be that key's: erase
// leaves it and lists it as unread instead of erasing it; the same form
// of a key whose other readings the table does not hold is erased.
func TestEraseAmbiguousKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	const schema = "erase_amb"
	spec := sink.TableSpec{Target: "orders_history", Schema: schema, Keys: []string{"order_id", "created_at"},
		Columns: []sink.Column{{Name: "order_id", Type: "integer"}, {Name: "created_at", Type: "timestamp"}, {Name: "note", Type: "text"}}}
	s := newSinkWith(t, pool, sink.Config{Schema: schema, Tables: []sink.TableSpec{spec}, ErasureSecret: []byte("0123456789abcdef0123456789abcdef")})
	day := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	other := time.UnixMicro(day.UnixMilli()).UTC() // 1970-01-20 17:21:07.2
	var evs []*change.Event
	for i, k := range []struct {
		id int64
		at time.Time
	}{{1, day}, {1, other}, {2, day}} {
		evs = append(evs, &change.Event{Table: spec.Target, Key: []any{k.id, k.at}, Seq: change.MustSeq(i + 1), Op: change.OpCreate,
			ValidFrom: day, After: map[string]any{"order_id": k.id, "created_at": k.at, "note": "n"}})
	}
	if _, err := s.Apply(ctx, sink.Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for i, id := range []int{1, 2} {
		var dl int64
		if err := pool.QueryRow(ctx, `INSERT INTO erase_amb.scd2sink_dead_letters (topic, partition, "offset", target, key, value, error, created_at, decoded)
			VALUES ('shop.public.orders', 0, $1, 'orders_history', $2, 'not json', 'a test', now(), false) RETURNING id`,
			i, []byte(fmt.Sprintf(`{"order_id":%d,"created_at":%d}`, id, day.UnixMilli()))).Scan(&dl); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, dl)
	}
	res, err := s.Erase(ctx, sink.EraseRequest{Target: spec.Target, Reason: "test",
		Keys: [][]string{{"1", "2024-01-01 00:00:00"}, {"2", "2024-01-01 00:00:00"}}})
	if err != nil {
		t.Fatal(err)
	}
	var left []int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM erase_amb.scd2sink_dead_letters`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != ids[0] || len(res.UnreadDeadLetters) != 1 || res.UnreadDeadLetters[0] != ids[0] {
		t.Errorf("dead letters left %v, listed unread %v; want only %d (key 1, which may be 1970's) in both", left, res.UnreadDeadLetters, ids[0])
	}
	var held int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM erase_amb.orders_history WHERE order_id = 1 AND created_at = $1`, other).Scan(&held); err != nil || held != 1 {
		t.Errorf("the other key (1, %s): %d versions (%v)", other, held, err)
	}
}
