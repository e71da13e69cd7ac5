package app

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/internal/pgtest"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"go.uber.org/zap/zaptest"
)

// schemaRig runs the service over one source table sent twice, as
// Debezium's JSON with schemas and as Avro through a registry, while the
// source's schema changes under it (DESIGN.md section 11).
type schemaRig struct {
	t        *testing.T
	json     *scdtest.Source
	avro     *scdtest.Source
	reg      *srfake.Registry
	cl       *kgo.Client
	pool     *pgxpool.Pool
	version  int // of the Avro value schema
	kafka    *kfake.Cluster
	dsn      string
	mode     string
	stop     func()
	lastLSN  int64
	produced int
}

func newSchemaRig(t *testing.T, mode string, cols []scdtest.Col) *schemaRig {
	t.Helper()
	r := &schemaRig{t: t, mode: mode,
		json: &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "accounts", Keys: []string{"id"}, Cols: slices.Clone(cols)},
		avro: &scdtest.Source{Server: "shop", DB: "shop", Schema: "public", Table: "accounts_avro", Keys: []string{"id"}, Cols: slices.Clone(cols)}}
	r.reg = srfake.New()
	t.Cleanup(r.reg.Close)
	r.reg.SeedSchema(r.avro.Topic()+"-key", 1, 1000, sr.Schema{Schema: r.avro.AvroKeySchema(), Type: sr.TypeAvro})
	r.register()
	var err error
	if r.kafka, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, r.json.Topic(), r.avro.Topic()),
		kfake.GroupMinSessionTimeout(time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.kafka.Close)
	if r.cl, err = kgo.NewClient(kgo.SeedBrokers(r.kafka.ListenAddrs()...)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.cl.Close)
	r.dsn = pgtest.NewDatabase(t)
	if r.pool, err = pgxpool.New(context.Background(), r.dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.pool.Close)
	r.start()
	t.Cleanup(func() { r.stop() })
	return r
}

// register registers the Avro value schema of the source's columns as
// they are now, as a new version of the subject.
func (r *schemaRig) register() {
	r.version++
	r.reg.SeedSchema(r.avro.Topic()+"-value", r.version, r.version, sr.Schema{Schema: r.avro.AvroValueSchema(), Type: sr.TypeAvro})
}

// alter changes the source's columns, as an ALTER TABLE at the source
// does, for both encodings.
func (r *schemaRig) alter(cols []scdtest.Col) {
	r.json.Cols, r.avro.Cols = slices.Clone(cols), slices.Clone(cols)
	r.register()
}

func (r *schemaRig) start() {
	r.t.Helper()
	brokers, _ := json.Marshal(r.kafka.ListenAddrs())
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
kafka: {brokers: %s, session_timeout: 2s}
postgres: {dsn: %q}
http: {addr: ""}
shutdown_timeout: 3s
schema_registry: {url: %q}
sequencer: {reorder_window: 10ms}
sink: {batch_max_wait: 10ms}
tables:
  - {topic: %s, target: accounts_history, schema_changes: %s}
  - {topic: %s, target: accounts_avro_history, format: debezium-avro, schema_changes: %s}
`, brokers, r.dsn, r.reg.URL(), r.json.Topic(), r.mode, r.avro.Topic(), r.mode)), func(string) (string, bool) { return "", false })
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, Options{Logger: zaptest.NewLogger(r.t)}) }()
	r.stop = func() { cancel(); <-done }
}

// produce sends one change of row id to both topics, a day after the
// previous one.
func (r *schemaRig) produce(op string, row scdtest.Row) {
	r.t.Helper()
	r.lastLSN += 10
	c := scdtest.Change{Op: op, After: row, LSN: r.lastLSN, Commit: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).AddDate(0, 0, int(r.lastLSN/10))}
	jk, jv := r.json.Envelope(c)
	ak, av := r.avro.AvroEnvelope(c, r.version, 1000)
	if err := r.cl.ProduceSync(context.Background(), &kgo.Record{Topic: r.json.Topic(), Key: jk, Value: jv},
		&kgo.Record{Topic: r.avro.Topic(), Key: ak, Value: av}).FirstErr(); err != nil {
		r.t.Fatal(err)
	}
	r.produced++
}

func (r *schemaRig) query(q string) string {
	var s string
	if err := r.pool.QueryRow(context.Background(), q).Scan(&s); err != nil {
		return "error: " + err.Error()
	}
	return s
}

// waitBoth waits until q, run over both history tables (%s), gives want.
func (r *schemaRig) waitBoth(q, want string) {
	r.t.Helper()
	for _, table := range []string{"accounts_history", "accounts_avro_history"} {
		qq := fmt.Sprintf(q, table)
		for deadline := time.Now().Add(20 * time.Second); r.query(qq) != want; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				r.t.Fatalf("%s:\n got %q\nwant %q", qq, r.query(qq), want)
			}
		}
	}
}

var schemaV1 = []scdtest.Col{
	{Name: "id", Schema: `{"type":"int32","optional":false}`},
	{Name: "plan", Schema: `{"type":"string","optional":true}`},
	{Name: "city", Schema: `{"type":"string","optional":true}`},
	{Name: "score", Schema: `{"type":"int64","optional":true}`},
	{Name: "visits", Schema: `{"type":"int16","optional":true}`},
}

// versionsQ renders a history as id plan city score visits [tier]
// from-to (days of March), one version per line.
const versionsQ = `SELECT string_agg(concat_ws(' ', id, coalesce(plan, '-'), coalesce(city, '-'), coalesce(score::text, '-'), coalesce(visits::text, '-'),
	to_char(valid_from, 'DD') || '-' || coalesce(to_char(valid_to, 'DD'), '')), ', ' ORDER BY id, scd_seq) FROM %s`

// TestSchemaChanges walks DESIGN.md section 11's table with schema_changes:
// evolve, through the service, for JSON with schemas and Avro (a new
// schema version in the registry at each change): a dropped column opens
// no version and is NULL in later ones; an added one shows in the current
// version at once and its next change opens one; a widened type is
// altered (the value that needs it stored); a narrowed one keeps the
// column's type; an incompatible one keeps it too and dead-letters the
// values that do not fit; a rename is a drop plus an add.
func TestSchemaChanges(t *testing.T) {
	t.Parallel()
	r := newSchemaRig(t, "evolve", schemaV1)
	row := scdtest.Row{"id": 1, "plan": "basic", "city": "Wien", "score": 5, "visits": 1}
	r.produce("c", row) // day 2
	r.waitBoth(versionsQ, "1 basic Wien 5 1 02-")

	// city dropped: the drop alone opens nothing; the next change does,
	// with city NULL.
	v2 := slices.DeleteFunc(slices.Clone(schemaV1), func(c scdtest.Col) bool { return c.Name == "city" })
	r.alter(v2)
	delete(row, "city")
	r.produce("u", row) // day 3
	row["plan"] = "pro"
	r.produce("u", row) // day 4
	r.waitBoth(versionsQ, "1 basic Wien 5 1 02-04, 1 pro - 5 1 04-")

	// tier added: the current version shows it at once, its change opens
	// a version.
	v3 := append(slices.Clone(v2), scdtest.Col{Name: "tier", Schema: `{"type":"string","optional":true}`})
	r.alter(v3)
	row["tier"] = "gold"
	r.produce("u", row) // day 5
	r.waitBoth(`SELECT string_agg(coalesce(tier, '-'), ',' ORDER BY scd_seq) FROM %s`, "-,gold")
	row["tier"] = "platinum"
	r.produce("u", row) // day 6
	r.waitBoth(`SELECT string_agg(coalesce(tier, '-') || ' ' || to_char(valid_from, 'DD'), ',' ORDER BY scd_seq) FROM %s`, "- 02,gold 04,platinum 06")

	// visits widened int16 → int32: the column is altered, 70000 stored.
	v4 := slices.Clone(v3)
	v4[3] = scdtest.Col{Name: "visits", Schema: `{"type":"int32","optional":true}`}
	r.alter(v4)
	row["visits"] = 70000
	r.produce("u", row) // day 7
	r.waitBoth(`SELECT format_type(atttypid, atttypmod) || ' ' || (SELECT visits FROM %[1]s WHERE is_current) FROM pg_attribute WHERE attrelid = '%[1]s'::regclass AND attname = 'visits'`, "integer 70000")

	// score narrowed int64 → int32: the column stays bigint, no version.
	v5 := slices.Clone(v4)
	v5[2] = scdtest.Col{Name: "score", Schema: `{"type":"int32","optional":true}`}
	r.alter(v5)
	r.produce("u", row) // day 8
	// score changed incompatibly to a string: what fits the bigint
	// column is stored, what does not is dead-lettered.
	v6 := slices.Clone(v5)
	v6[2] = scdtest.Col{Name: "score", Schema: `{"type":"string","optional":true}`}
	r.alter(v6)
	row["score"] = "not a number"
	r.produce("u", row) // day 9: dead letter
	r.waitBoth(`SELECT count(*)::text FROM scd2sink_dead_letters WHERE target = '%s'`, "1")

	// visits renamed visit_count: a drop and an add, no version; its next
	// change opens one.
	v7 := slices.Clone(v6)
	v7[3] = scdtest.Col{Name: "visit_count", Schema: `{"type":"int32","optional":true}`}
	v7[2] = scdtest.Col{Name: "score", Schema: `{"type":"int64","optional":true}`}
	r.alter(v7)
	delete(row, "visits")
	row["score"], row["visit_count"] = 5, 70000
	r.produce("u", row) // day 10
	row["visit_count"] = 70001
	r.produce("u", row) // day 11
	r.waitBoth(`SELECT string_agg(concat_ws(' ', coalesce(visits::text, '-'), coalesce(visit_count::text, '-'), to_char(valid_from, 'DD')), ',' ORDER BY scd_seq) FROM %s`,
		"1 - 02,1 - 04,1 - 06,70000 70000 07,- 70001 11")
	r.waitBoth(versionsQ, "1 basic Wien 5 1 02-04, 1 pro - 5 1 04-06, 1 pro - 5 1 06-07, 1 pro - 5 70000 07-11, 1 pro - 5 - 11-")
	r.waitBoth(`SELECT scd_absent::text FROM %s WHERE is_current`, "{city,visits}")
}

// TestSchemaChangesFail: with schema_changes: fail an added column goes
// on, but a dropped column or a changed type stops the table's events
// (nothing applied, nothing dead-lettered, the service running) until the
// operator acts; here by switching to evolve, after which they apply.
func TestSchemaChangesFail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func([]scdtest.Col) []scdtest.Col
		row    scdtest.Row
		want   string
	}{
		{"drop", func(c []scdtest.Col) []scdtest.Col {
			return slices.DeleteFunc(c, func(c scdtest.Col) bool { return c.Name == "city" })
		}, scdtest.Row{"id": 1, "plan": "pro", "score": 5, "visits": 1}, "1 basic Wien 5 1 02-04, 1 pro - 5 1 04-"},
		{"widen", func(c []scdtest.Col) []scdtest.Col {
			c[4] = scdtest.Col{Name: "visits", Schema: `{"type":"int32","optional":true}`}
			return c
		}, scdtest.Row{"id": 1, "plan": "pro", "city": "Wien", "score": 5, "visits": 70000}, "1 basic Wien 5 1 02-04, 1 pro Wien 5 70000 04-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newSchemaRig(t, "fail", schemaV1)
			r.produce("c", scdtest.Row{"id": 1, "plan": "basic", "city": "Wien", "score": 5, "visits": 1}) // day 2
			r.waitBoth(versionsQ, "1 basic Wien 5 1 02-")
			// An added column is no change fail stops at.
			withTier := append(slices.Clone(schemaV1), scdtest.Col{Name: "tier", Schema: `{"type":"string","optional":true}`})
			r.alter(withTier)
			r.produce("u", scdtest.Row{"id": 1, "plan": "basic", "city": "Wien", "score": 5, "visits": 1, "tier": "gold"}) // day 3
			r.waitBoth(`SELECT coalesce(tier, '-') FROM %s WHERE is_current`, "gold")

			r.alter(tc.change(slices.Clone(withTier)))
			tc.row["tier"] = "gold"
			r.produce("u", tc.row) // day 4
			time.Sleep(1500 * time.Millisecond)
			r.waitBoth(versionsQ, "1 basic Wien 5 1 02-")
			r.waitBoth(`SELECT count(*)::text FROM scd2sink_dead_letters WHERE target = '%s'`, "0")

			// A stop does not wait on the blocked batch: it is left for
			// the next start at once, well inside shutdown_timeout (3s).
			stopAt := time.Now()
			r.stop()
			if d := time.Since(stopAt); d > 2*time.Second {
				t.Errorf("stopping took %s with a batch blocked", d)
			}
			r.mode = "evolve"
			r.start()
			r.waitBoth(versionsQ, tc.want)
		})
	}
}
