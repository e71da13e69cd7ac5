package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/sink"
	"go.uber.org/zap"
)

// DeadLetterQuery chooses dead letters: by ids, by target, or all; Since
// (list only) keeps those written at or after it. Replayed ones are left
// out.
type DeadLetterQuery struct {
	IDs   []int64
	Table string
	All   bool
	Since string // RFC 3339 or YYYY-MM-DD
}

// ErrFailedAgain is Replay's error when some dead letters were rejected
// again (they stay, with the new error).
var ErrFailedAgain = errors.New("some dead letters failed again")

// deadLetter is one row of the dead-letter table.
type deadLetter struct {
	id               int64
	at               time.Time
	topic            string
	partition        int32
	offset           int64
	target           string
	key, value, hdrs []byte
	err              string
	decoded          bool // Key and Value are the decoded form: read the record again
}

func selectDeadLetters(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, q DeadLetterQuery) ([]deadLetter, error) {
	var since *time.Time
	if q.Since != "" {
		t, err := parseTime(q.Since)
		if err != nil {
			return nil, &config.Error{Key: "--since", Msg: err.Error()}
		}
		since = &t
	}
	ids := q.IDs
	if ids == nil {
		ids = []int64{}
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT id, created_at, coalesce(topic, ''), coalesce(partition, -1), coalesce("offset", -1),
			coalesce(target, ''), key, value, headers, error, decoded
		FROM %s WHERE replayed_at IS NULL
			AND (cardinality($1::bigint[]) = 0 OR id = ANY($1))
			AND ($2 = '' OR target = $2 OR topic = $2)
			AND ($3::timestamptz IS NULL OR created_at >= $3)
		ORDER BY id`, pgx.Identifier{cfg.Postgres.Schema, cfg.Sink.DeadLetterTable}.Sanitize()), ids, q.Table, since)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", cfg.Sink.DeadLetterTable, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadLetter, error) {
		var d deadLetter
		var decoded *bool
		err := r.Scan(&d.id, &d.at, &d.topic, &d.partition, &d.offset, &d.target, &d.key, &d.value, &d.hdrs, &d.err, &decoded)
		if decoded != nil {
			d.decoded = *decoded
		} else {
			d.decoded = decodedForm(d.value)
		}
		return d, err
	})
}

func parseTime(v string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is neither RFC 3339 nor YYYY-MM-DD", v)
}

// ListDeadLetters prints the dead letters not replayed as an aligned
// table, one line each: id, time, topic, partition, offset, key, error.
func ListDeadLetters(ctx context.Context, cfg *config.Config, q DeadLetterQuery, out io.Writer) error {
	pool, err := Pool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if ok, err := tableExists(ctx, pool, cfg.Postgres.Schema, cfg.Sink.DeadLetterTable); err != nil {
		return err
	} else if !ok {
		fmt.Fprintf(out, "no dead letters: %s\n", notWrittenYet(cfg.Postgres.Schema))
		return nil
	}
	list, err := selectDeadLetters(ctx, pool, cfg, q)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "id\ttime\ttopic\tpartition\toffset\tkey\terror")
	for _, d := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\n", d.id, d.at.UTC().Format(time.RFC3339), d.topic, d.partition, d.offset,
			oneLine(string(d.key), 60), oneLine(d.err, 160))
	}
	return tw.Flush()
}

// oneLine clips s to n runes on one line, for a table cell.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(strings.ToValidUTF8(s, "?")), " ")
	if utf8.RuneCountInString(s) > n {
		r := []rune(s)
		s = string(r[:n-1]) + "…"
	}
	if s == "" {
		s = "-"
	}
	return s
}

// ReplayDeadLetters applies the chosen dead letters again through the
// normal path (DESIGN.md section 7): each is decoded as it was consumed
// and applied as a late event of its key (repairs recorded in
// <target>_scd_repairs), marked replayed_at in the same transaction, never
// twice; one rejected again stays, with the new error. It prints a line
// per dead letter and returns ErrFailedAgain when any failed again. A
// running `run` is not disturbed: the replay takes its partitions' locks
// in turn and makes its writers forget what they remember of the keys.
func ReplayDeadLetters(ctx context.Context, cfg *config.Config, opts Options, q DeadLetterQuery, out io.Writer) error {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if len(q.IDs) == 0 && q.Table == "" && !q.All {
		return &config.Error{Key: "--id", Msg: "name the dead letters to replay: --id N[,N...], --table TARGET or --all"}
	}
	if err := noRebuild(ctx, cfg, opts); err != nil {
		return err
	}
	pool, err := Pool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if ok, err := tableExists(ctx, pool, cfg.Postgres.Schema, cfg.Sink.DeadLetterTable); err != nil {
		return err
	} else if !ok {
		fmt.Fprintf(out, "nothing to replay: %s\n", notWrittenYet(cfg.Postgres.Schema))
		return nil
	}
	dec, err := Decoder(cfg, log.Named("decoder"))
	if err != nil {
		return err
	}
	s, err := commandSink(ctx, cfg, pool, dec, log)
	if err != nil {
		return err
	}
	var list []deadLetter
	for try := 0; ; try++ {
		if list, err = selectDeadLetters(ctx, pool, cfg, q); err != nil {
			return err
		}
		err = replay(ctx, dec, s, pool, cfg, opts, list)
		if !errors.Is(err, sink.ErrReplayedAlready) || try == 2 {
			break
		}
		log.Info("another replay marked some of these first; reading them again")
	}
	if err != nil {
		return err
	}
	// What became of each: replayed, or still a dead letter with its error.
	failed := 0
	for _, d := range list {
		var replayed *time.Time
		var msg string
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT replayed_at, error FROM %s WHERE id = $1`,
			pgx.Identifier{cfg.Postgres.Schema, cfg.Sink.DeadLetterTable}.Sanitize()), d.id).Scan(&replayed, &msg); err != nil {
			return fmt.Errorf("reading dead letter %d: %w", d.id, err)
		}
		if replayed != nil {
			fmt.Fprintf(out, "%d\tapplied\t%s\n", d.id, d.target)
			continue
		}
		failed++
		fmt.Fprintf(out, "%d\tfailed again\t%s\t%s\n", d.id, d.target, oneLine(msg, 300))
	}
	fmt.Fprintf(out, "%d replayed, %d failed again\n", len(list)-failed, failed)
	if failed > 0 {
		return fmt.Errorf("%d of %d: %w", failed, len(list), ErrFailedAgain)
	}
	return nil
}

// replayChunk bounds the events one replay transaction applies.
const replayChunk = 2000

// replay decodes the dead letters and applies those that decode, in
// chunks, recording on their rows those that do not.
func replay(ctx context.Context, dec *debezium.Decoder, s *sink.Sink, pool *pgxpool.Pool, cfg *config.Config, opts Options, list []deadLetter) error {
	table := pgx.Identifier{cfg.Postgres.Schema, cfg.Sink.DeadLetterTable}.Sanitize()
	// Those rejected after decoding are read again from Kafka: the row
	// keeps their decoded form, not the record.
	var again []change.Origin
	for _, d := range list {
		if d.decoded {
			again = append(again, change.Origin{Partition: change.Partition{Topic: d.topic, Partition: d.partition}, Offset: d.offset})
		}
	}
	records, err := refetch(ctx, cfg, opts, again)
	if err != nil {
		return fmt.Errorf("reading dead letters' records again from Kafka: %w", err)
	}
	var evs []*change.Event
	byOrigin := map[change.Origin][]int64{}
	locks := map[change.Partition]bool{}
	flush := func() error {
		if len(evs) == 0 {
			return nil
		}
		var lock []change.Partition
		for p := range locks {
			lock = append(lock, p)
		}
		if err := retried(ctx, func(ctx context.Context) error {
			_, err := s.Apply(ctx, sink.Batch{Events: evs, Lock: lock, Replay: byOrigin})
			return err
		}); err != nil {
			return fmt.Errorf("replaying %d dead letters: %w", len(evs), err)
		}
		evs, byOrigin, locks = nil, map[change.Origin][]int64{}, map[change.Partition]bool{}
		return nil
	}
	for _, d := range list {
		o := change.Origin{Partition: change.Partition{Topic: d.topic, Partition: d.partition}, Offset: d.offset}
		if ids, ok := byOrigin[o]; ok { // the same record dead-lettered twice
			byOrigin[o] = append(ids, d.id)
			continue
		}
		key, value := d.key, d.value
		var headers []debezium.Header
		var err error
		if d.decoded {
			if r, ok := records[o]; ok {
				key, value = r.Key, r.Value
				for _, h := range r.Headers {
					headers = append(headers, debezium.Header{Key: h.Key, Value: h.Value})
				}
			} else {
				err = errGone
			}
		} else {
			var hs []sink.Header
			if len(d.hdrs) > 0 {
				if err := json.Unmarshal(d.hdrs, &hs); err != nil {
					return fmt.Errorf("dead letter %d: its headers: %w", d.id, err)
				}
			}
			for _, h := range hs {
				headers = append(headers, debezium.Header{Key: strings.ReplaceAll(h.Key, `\0`, "\x00"), Value: h.Value})
			}
		}
		var ev *change.Event
		if err == nil {
			dctx, cancel := context.WithTimeout(ctx, cfg.SchemaRegistry.LookupTimeout+10*time.Second)
			ev, err = dec.Decode(dctx, o, key, value, headers...)
			cancel()
		}
		if err == nil && d.decoded && ev.Seq != nil && !sameEvent(d.value, ev) {
			err = fmt.Errorf("the record now at %s/%d offset %d is another event (sequence %s): was the topic re-created?", d.topic, d.partition, d.offset, ev.Seq)
		}
		switch {
		case errors.Is(err, debezium.ErrRetry):
			return fmt.Errorf("dead letter %d: %w (try again when the registry answers)", d.id, err)
		case errors.Is(err, debezium.ErrSkip):
			// Nothing to apply (it decodes as a tombstone or heartbeat now).
			if _, err := pool.Exec(ctx, `UPDATE `+table+` SET replayed_at = now() WHERE id = $1 AND replayed_at IS NULL`, d.id); err != nil {
				return err
			}
			continue
		case err == nil && ev.Seq == nil:
			err = errors.New("a snapshot read without a sequence cannot be replayed: nothing orders it among its key's events")
		}
		if err != nil {
			if _, err := pool.Exec(ctx, `UPDATE `+table+` SET error = $2 WHERE id = $1`, d.id,
				strings.ToValidUTF8(strings.ReplaceAll("replay: "+err.Error(), "\x00", ""), "\uFFFD")); err != nil {
				return err
			}
			continue
		}
		ev.SnapshotEnd = false // its snapshot was recorded, or not, when it was consumed
		evs = append(evs, ev)
		byOrigin[o] = []int64{d.id}
		locks[o.Partition] = true
		if len(evs) == replayChunk {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// noRebuild refuses while a rebuild runs (its group has members): what a
// replay or a confirmation wrote into the live tables would be lost at
// the swap. Kafka not answering within 10 s is no refusal.
func noRebuild(ctx context.Context, cfg *config.Config, opts Options) error {
	adm, cl, err := opts.kafkaAdmin(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	group := cfg.Kafka.GroupID + RebuildSuffix
	groups, err := adm.DescribeGroups(dctx, group)
	if err != nil {
		return nil
	}
	if g, ok := groups[group]; ok && len(g.Members) > 0 {
		return fmt.Errorf("a rebuild is running (group %s has %d members): its swap would drop what this writes into the live tables; run this after the rebuild", group, len(g.Members))
	}
	return nil
}
