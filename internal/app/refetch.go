package app

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/twmb/franz-go/pkg/kgo"
)

// refetchBudget bounds reading dead letters' records again from Kafka.
const refetchBudget = 30 * time.Second

// refetch reads the records at the given coordinates from Kafka (as the
// consumer does: read_committed unless configured otherwise), each
// partition from its lowest wanted offset up to its highest. A record
// Kafka no longer has (retention, compaction) is absent from the result.
func refetch(ctx context.Context, cfg *config.Config, opts Options, want []change.Origin) (map[change.Origin]*kgo.Record, error) {
	out := map[change.Origin]*kgo.Record{}
	if len(want) == 0 {
		return out, nil
	}
	byPart := map[change.Partition][]int64{}
	for _, o := range want {
		byPart[o.Partition] = append(byPart[o.Partition], o.Offset)
	}
	start := map[string]map[int32]kgo.Offset{}
	last := map[change.Partition]int64{}
	for p, offs := range byPart {
		sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
		if start[p.Topic] == nil {
			start[p.Topic] = map[int32]kgo.Offset{}
		}
		start[p.Topic][p.Partition] = kgo.NewOffset().At(offs[0])
		last[p] = offs[len(offs)-1]
	}
	extra := []kgo.Opt{kgo.ConsumePartitions(start)}
	if cfg.Kafka.IsolationLevel != "read_uncommitted" {
		extra = append(extra, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := opts.kafkaClient(cfg, extra...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	wanted := map[change.Origin]bool{}
	for _, o := range want {
		wanted[o] = true
	}
	fctx, cancel := context.WithTimeout(ctx, refetchBudget)
	defer cancel()
	for len(last) > 0 {
		fetches := cl.PollFetches(fctx)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if fctx.Err() != nil {
			var parts []string
			for p := range last {
				parts = append(parts, fmt.Sprintf("%s/%d", p.Topic, p.Partition))
			}
			sort.Strings(parts)
			return nil, fmt.Errorf("reading %v again took over %s: try again (fewer at a time, with --id)", parts, refetchBudget)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			p := change.Partition{Topic: r.Topic, Partition: r.Partition}
			o := change.Origin{Partition: p, Offset: r.Offset}
			if wanted[o] {
				out[o] = r
			}
			if end, ok := last[p]; ok && r.Offset >= end {
				delete(last, p)
				cl.PauseFetchPartitions(map[string][]int32{p.Topic: {p.Partition}})
			}
		})
		fetches.EachPartition(func(f kgo.FetchTopicPartition) {
			p := change.Partition{Topic: f.Topic, Partition: f.Partition}
			if end, ok := last[p]; ok && f.HighWatermark >= 0 && f.HighWatermark <= end {
				delete(last, p) // the log ends before it
			}
		})
	}
	return out, nil
}

// sameEvent reports whether ev, decoded from the record read again at a
// dead letter's coordinates, is the event the dead letter keeps in its
// decoded form (the same sequence): a topic deleted and re-created holds
// another record at the same offset.
func sameEvent(value []byte, ev *change.Event) bool {
	if decodedForm(value) {
		var stored struct {
			Seq json.RawMessage `json:"seq"`
		}
		if json.Unmarshal(value, &stored) != nil {
			return false
		}
		var a, b any
		got, _ := json.Marshal(ev.Seq.Parts())
		return json.Unmarshal(stored.Seq, &a) == nil && json.Unmarshal(got, &b) == nil && reflect.DeepEqual(a, b)
	}
	if strings.HasPrefix(string(value), "op=") { // the sequencer's conflicts (consumer/batch.go)
		return strings.Contains(string(value), " seq="+ev.Seq.String()+" ")
	}
	return true
}

// decodedForm reports whether a dead letter's value is the decoded form of
// an event (sink.DeadLetter.Decoded), for rows written before the decoded
// column: a JSON object with exactly op, seq, valid_from and after.
func decodedForm(value []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(value, &m) != nil || len(m) != 4 {
		return false
	}
	for _, k := range []string{"op", "seq", "valid_from", "after"} {
		if _, ok := m[k]; !ok {
			return false
		}
	}
	return true
}

// errGone explains a decoded dead letter whose record Kafka no longer has.
var errGone = fmt.Errorf("its record is no longer in Kafka (retention or compaction), and a dead letter rejected after decoding keeps only its decoded form, which cannot be decoded again; rebuild or apply the change by hand")
