package scdtest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// BenchRecord is one Kafka record of the benchmark workload: a change of
// one of its sources, or the tombstone that follows a delete (same key,
// null value).
type BenchRecord struct {
	Src       *Source
	Change    Change
	Tombstone bool
}

// BenchCustomers is the first benchmark table, with the default replica
// identity (updates have before null, deletes a before of the key only):
// numeric, date, timestamptz, jsonb and a text of about 300 bytes.
// Tracked: plan, city, score.
func BenchCustomers() *Source {
	return &Source{Server: "bench", DB: "bench", Schema: "public", Table: "customers", Keys: []string{"id"},
		Cols: []Col{
			{Name: "id", Schema: `{"type":"int64","optional":false}`},
			{Name: "name", Schema: `{"type":"string","optional":true}`},
			{Name: "plan", Schema: `{"type":"string","optional":true}`},
			{Name: "city", Schema: `{"type":"string","optional":true}`},
			{Name: "score", Schema: `{"type":"int64","optional":true}`},
			{Name: "balance", Schema: `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"12"}}`},
			{Name: "birth", Schema: `{"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1}`},
			{Name: "signed_up", Schema: `{"type":"string","optional":true,"name":"io.debezium.time.ZonedTimestamp","version":1}`},
			{Name: "attrs", Schema: `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`},
			{Name: "bio", Schema: `{"type":"string","optional":true}`},
		}}
}

// BenchAccounts is the second benchmark table, with REPLICA IDENTITY FULL
// (updates and deletes carry the full before image). Tracked: status,
// tier, credit_limit.
func BenchAccounts() *Source {
	return &Source{Server: "bench", DB: "bench", Schema: "public", Table: "accounts", Keys: []string{"id"},
		Cols: []Col{
			{Name: "id", Schema: `{"type":"int64","optional":false}`},
			{Name: "owner", Schema: `{"type":"string","optional":true}`},
			{Name: "status", Schema: `{"type":"string","optional":true}`},
			{Name: "tier", Schema: `{"type":"int32","optional":true}`},
			{Name: "credit_limit", Schema: `{"type":"bytes","optional":true,"name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{"scale":"2","connect.decimal.precision":"14"}}`},
			{Name: "opened", Schema: `{"type":"int32","optional":true,"name":"io.debezium.time.Date","version":1}`},
			{Name: "updated_at", Schema: `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1}`},
			{Name: "meta", Schema: `{"type":"string","optional":true,"name":"io.debezium.data.Json","version":1}`},
			{Name: "note", Schema: `{"type":"string","optional":true}`},
		}}
}

// BenchTracked are the tracked columns of the benchmark tables, by table.
var BenchTracked = map[string][]string{"customers": {"plan", "city", "score"}, "accounts": {"status", "tier", "credit_limit"}}

// BenchWorkload generates the benchmark's records: a snapshot of nKeys
// rows (60% customers, 40% accounts; all reads carry the snapshot's LSN),
// then streaming changes until nEvents changes in all, in transactions of
// one to three changes: about 60% tracked updates, 30% Type-1-only
// updates, 5% deletes (each followed by its tombstone) and re-creates of
// deleted keys. Tombstones are records but not changes.
func BenchWorkload(rng *rand.Rand, nKeys, nEvents int) []BenchRecord {
	srcs := []*Source{BenchCustomers(), BenchAccounts()}
	nk := []int{nKeys * 6 / 10, nKeys - nKeys*6/10}
	rows := [2][]Row{make([]Row, nk[0]), make([]Row, nk[1])}
	recs := make([]BenchRecord, 0, nEvents+nEvents/15)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const snapLSN = 1 << 24
	lsn, prev := int64(snapLSN), int64(0)
	n := 0
	for t := range srcs {
		for k := range nk[t] {
			rows[t][k] = benchRow(t, k, 0)
			snap := "true"
			switch {
			case n == 0:
				snap = "first"
			case n == nKeys-1:
				snap = "last"
			}
			recs = append(recs, BenchRecord{Src: srcs[t], Change: Change{Op: "r", After: rows[t][k], LSN: snapLSN, TxID: 700, Commit: at, Snapshot: snap}})
			n++
		}
	}
	tx := int64(701)
	for n < nEvents {
		at = at.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
		size := 1 + rng.IntN(3)
		for range size {
			lsn += 56
			t := 0
			if rng.IntN(10) >= 6 {
				t = 1
			}
			k := rng.IntN(nk[t])
			old := rows[t][k]
			c := Change{LSN: lsn, PrevLSN: prev, TxID: tx, Commit: at}
			r := rng.IntN(100)
			switch {
			case old == nil:
				c.Op, c.After = "c", benchRow(t, k, n)
			case r < 5:
				c.Op = "d"
				c.Before = Row{"id": k}
				if t == 1 {
					c.Before = old
				}
			case r < 35:
				c.Op, c.After = "u", benchType1(t, old, n)
			default:
				c.Op, c.After = "u", benchTracked(rng, t, old, n)
			}
			if t == 1 && c.Op == "u" {
				c.Before = old
			}
			rows[t][k] = c.After
			recs = append(recs, BenchRecord{Src: srcs[t], Change: c})
			if c.Op == "d" {
				recs = append(recs, BenchRecord{Src: srcs[t], Change: c, Tombstone: true})
			}
			n++
		}
		prev = lsn
		tx++
	}
	return recs
}

var (
	benchPlans    = []string{"basic", "pro", "team", "enterprise"}
	benchCities   = []string{"Wien", "Linz", "Graz", "Salzburg", "Innsbruck"}
	benchStatuses = []string{"open", "frozen", "review", "closed"}
)

func benchRow(t, k, n int) Row {
	at := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(k) * time.Minute)
	if t == 0 {
		return Row{"id": k, "name": fmt.Sprintf("customer %d", k), "plan": benchPlans[k%4], "city": benchCities[k%5], "score": n,
			"balance": DecimalB64(strconv.Itoa(k*137%1000000 - 500000)), "birth": 3000 + k%20000, "signed_up": Zoned(at),
			"attrs": fmt.Sprintf(`{"tier": %d, "tags": ["a", "b"], "score": 1.10}`, k%5),
			"bio":   strings.Repeat(fmt.Sprintf("Customer %d likes long walks. ", k), 10)}
	}
	return Row{"id": k, "owner": fmt.Sprintf("owner-%d@example.com", k), "status": "open", "tier": k % 3,
		"credit_limit": DecimalB64(strconv.Itoa(k * 1000)), "opened": 18000 + k%2000, "updated_at": at.UnixMicro(),
		"meta": fmt.Sprintf(`{"branch": "B%d", "flags": [1, 2]}`, k%50), "note": strings.Repeat("account note ", 15)}
}

func benchType1(t int, old Row, n int) Row {
	r := copyRow(old)
	if t == 0 {
		r["name"] = fmt.Sprintf("customer %v v%d", old["id"], n)
		r["attrs"] = fmt.Sprintf(`{"tier": %d, "tags": ["a"], "seen": %d}`, n%5, n)
	} else {
		r["updated_at"] = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(n) * time.Millisecond).UnixMicro()
		r["note"] = fmt.Sprintf("account note %d ", n) + strings.Repeat("x", 150)
	}
	return r
}

func benchTracked(rng *rand.Rand, t int, old Row, n int) Row {
	r := copyRow(old)
	if t == 0 {
		r["plan"] = benchPlans[rng.IntN(4)]
		r["score"] = n
		if rng.IntN(4) == 0 {
			r["city"] = benchCities[rng.IntN(5)]
		}
	} else {
		r["status"] = benchStatuses[rng.IntN(4)]
		r["tier"] = rng.IntN(3)
		r["credit_limit"] = DecimalB64(strconv.Itoa(n * 10))
		r["updated_at"] = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(n) * time.Millisecond).UnixMicro()
	}
	return r
}

func copyRow(r Row) Row {
	out := make(Row, len(r))
	for k, v := range r {
		out[k] = v
	}
	return out
}

// Schemaless renders a change as JsonConverter writes it with
// schemas.enable=false: the payloads of Envelope's key and value.
func (s *Source) Schemaless(c Change) (key, value []byte) {
	k, v := s.Envelope(c)
	var kp, vp struct {
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(k, &kp); err != nil {
		panic(err)
	}
	if err := json.Unmarshal(v, &vp); err != nil {
		panic(err)
	}
	return kp.Payload, vp.Payload
}
