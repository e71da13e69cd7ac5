package scdtest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
)

// Debezium renders an event as Debezium's JSON without schemas: the Kafka
// key (the key columns) and the envelope, with the event's sequence as
// source.lsn and its time as source.ts_ms. keys names the key columns.
func Debezium(ev *change.Event, keys []string) (key, value []byte) {
	seq, _ := strconv.ParseInt(ev.Seq.Parts()[0], 10, 64)
	source := map[string]any{"lsn": seq, "ts_ms": ev.ValidFrom.UnixMilli()}
	if ev.SnapshotEnd {
		source["snapshot"] = "last"
	} else if ev.Op == change.OpRead {
		source["snapshot"] = "true"
	}
	env := map[string]any{"op": ev.Op.String(), "ts_ms": ev.ValidFrom.UnixMilli() + 5, "source": source}
	if ev.Key != nil {
		k := map[string]any{}
		for i, name := range keys {
			k[name] = ev.Key[i]
		}
		key, _ = json.Marshal(k)
		if ev.Op == change.OpDelete {
			env["before"] = k
		}
	}
	if ev.After != nil {
		env["after"] = ev.After
	}
	value, _ = json.Marshal(env)
	return key, value
}

// BenchEvents makes a snapshot of nKeys rows of table followed by updates
// up to nEvents in all; type1PerMille of the updates change only the
// Type 1 column name, the others the tracked plan and score.
func BenchEvents(rng *rand.Rand, table string, nKeys, nEvents, type1PerMille int) []*change.Event {
	plans := []string{"basic", "pro", "team", "enterprise"}
	cities := []string{"Wien", "Linz", "Graz", "Salzburg", "Innsbruck"}
	rows := make([]map[string]any, nKeys)
	evs := make([]*change.Event, 0, nEvents)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < nEvents; i++ {
		k := i
		op := change.OpRead
		if i >= nKeys {
			k, op = rng.IntN(nKeys), change.OpUpdate
		}
		at = at.Add(time.Second)
		row := map[string]any{}
		if rows[k] == nil {
			row = map[string]any{"id": json.Number(strconv.Itoa(k)), "name": fmt.Sprintf("customer %d", k),
				"plan": plans[k%4], "city": cities[k%5], "score": json.Number("0")}
		} else {
			for c, v := range rows[k] {
				row[c] = v
			}
			if rng.IntN(1000) < type1PerMille {
				row["name"] = fmt.Sprintf("customer %d v%d", k, i)
			} else {
				row["plan"] = plans[rng.IntN(4)]
				row["score"] = json.Number(strconv.Itoa(i))
			}
		}
		rows[k] = row
		evs = append(evs, &change.Event{Table: table, Key: []any{json.Number(strconv.Itoa(k))},
			Seq: change.MustSeq(int64(i + 1)), Op: op, ValidFrom: at, After: row,
			Origin: change.Origin{Partition: change.Partition{Topic: "bench"}, Offset: int64(i)}})
	}
	return evs
}
