package debezium_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/config"
	"github.com/scd2sink/scd2sink/debezium"
	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/tidwall/gjson"
)

// Records flattened by Debezium's ExtractNewRecordState (add.fields
// op,source.lsn,source.ts_ms; delete.tombstone.handling.mode=rewrite) build
// the same history as the envelopes they were made from, with the same
// configuration: sequence_by and valid_from name the envelope's paths,
// read from the fields the transform added.
func TestFlattenedRecords(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	src := &scdtest.Source{Server: "shop", Schema: "public", Table: "customers", Keys: []string{"id"}, Cols: []scdtest.Col{
		{Name: "id", Schema: `{"type":"int32","optional":false}`},
		{Name: "plan", Schema: `{"type":"string","optional":true}`},
		{Name: "qty", Schema: `{"type":"int32","optional":true}`},
		{Name: "changed", Schema: `{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp","version":1}`},
		// Columns of the row named like envelope fields, and a Mongoose-style
		// __v: the row's, not the transform's.
		{Name: "op", Schema: `{"type":"string","optional":true}`},
		// Columns named like the transform's own fields (__version,
		// __table, __id): the row's, as a row column follows them.
		{Name: "__version", Schema: `{"type":"int32","optional":true}`},
		{Name: "__table", Schema: `{"type":"string","optional":true}`},
		{Name: "__id", Schema: `{"type":"string","optional":true}`},
		{Name: "__v", Schema: `{"type":"int32","optional":true}`},
	}}
	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	row := func(id int, plan string, qty int, sec int) scdtest.Row {
		return scdtest.Row{"id": id, "plan": plan, "qty": qty, "changed": at.Add(time.Duration(sec)*time.Second + 250*time.Millisecond).UnixMicro(),
			"op": "x", "__version": 10 + sec, "__table": "t" + strconv.Itoa(sec), "__id": strconv.Itoa(id), "__v": sec}
	}
	changes := []scdtest.Change{
		{Op: "r", After: row(3, "basic", 1, 0), LSN: 100, Commit: at, Snapshot: "last"},
		{Op: "c", After: row(1, "basic", 1, 1), LSN: 200, Commit: at.Add(time.Second)},
		{Op: "c", After: row(2, "pro", 2, 1), LSN: 210, Commit: at.Add(time.Second)},
		{Op: "u", Before: row(1, "basic", 1, 1), After: row(1, "pro", 1, 2), LSN: 300, Commit: at.Add(2 * time.Second)},
		{Op: "d", Before: row(1, "pro", 1, 2), LSN: 400, Commit: at.Add(3 * time.Second)},
		{Op: "u", Before: row(2, "pro", 2, 1), After: row(2, "pro", 5, 3), LSN: 410, Commit: at.Add(3 * time.Second)},
		{Op: "c", After: row(1, "team", 3, 4), LSN: 500, Commit: at.Add(4 * time.Second)},
	}
	history := func(target string, flat bool, validFrom string) []string {
		t.Helper()
		d := debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: target, SequenceBy: []string{"source.lsn"}, ValidFrom: validFrom}}, nil, nil)
		var recs [][2][]byte
		for _, c := range changes {
			k, v := src.Envelope(c)
			if flat {
				v = scdtest.Flatten(v, "op", "source.lsn", "source.ts_ms")
			}
			recs = append(recs, [2][]byte{k, v})
		}
		spec := sink.TableSpec{Target: target, Schema: "public", Keys: []string{"id"}}
		s := newSink(t, pool, spec)
		if _, err := s.Apply(ctx, sink.Batch{Events: decodeAll(t, d, src.Topic(), recs)}); err != nil {
			t.Fatal(err)
		}
		return scdtest.HistoryLines(t, pool, spec, []string{"plan", "qty", "changed", "op", "__version", "__table", "__id", "__v"})
	}
	for _, vf := range []string{"source.ts_ms", "after.changed"} {
		t.Run(vf, func(t *testing.T) {
			name := strings.ReplaceAll(vf, ".", "_")
			want := history("env_"+name, false, vf)
			got := history("flat_"+name, true, vf)
			if len(want) != 6 {
				t.Fatalf("the envelopes' history has %d versions, want 6:\n%s", len(want), strings.Join(want, "\n"))
			}
			if d := scdtest.DiffLines(want, got); d != "" {
				t.Errorf("flattened records' history differs from the envelopes':\n%s", d)
			}
		})
	}

	// Without the schema (JsonConverter schemas.enable=false) the payload's
	// order tells: the transform's fields are its trailing run.
	t.Run("schemaless", func(t *testing.T) {
		d := debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: "x", SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, nil, nil)
		k, v := src.Envelope(changes[3])
		flat := scdtest.Flatten(v, "op", "source.lsn", "source.ts_ms", "source.version", "source.table")
		payload := []byte(gjson.GetBytes(flat, "payload").Raw)
		ev, err := d.Decode(ctx, change.Origin{Partition: change.Partition{Topic: src.Topic()}}, k, payload)
		if err != nil {
			t.Fatal(err)
		}
		img := string(ev.AfterJSON)
		for _, c := range []string{`"__version":12`, `"__table":"t2"`, `"__id":"1"`, `"__v":2`} {
			if !strings.Contains(img, c) {
				t.Errorf("the row lacks its column %s: %s", c, img)
			}
		}
		for _, c := range []string{"__op", "__source_lsn", "__source_version", "__source_table", "__deleted"} {
			if strings.Contains(img, c) {
				t.Errorf("the row holds the transform's %s: %s", c, img)
			}
		}
		if ev.Op != change.OpUpdate || ev.Seq.String() != "[300]" {
			t.Errorf("op %s, sequence %s: want u, [300]", ev.Op, ev.Seq)
		}
	})
	t.Run("misconfigured transforms", func(t *testing.T) {
		d := debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: "x", SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, nil, nil)
		k, v := src.Envelope(changes[1])
		for _, tc := range []struct {
			what, want string
			fields     []string
		}{
			// ts_ms unqualified is the envelope's (when Debezium processed
			// the change), not source.ts_ms.
			{"add.fields=op,source.lsn,ts_ms", "valid_from path source.ts_ms is missing", []string{"op", "source.lsn", "ts_ms"}},
			{"add.fields without op", "__op", []string{"source.lsn", "source.ts_ms"}},
		} {
			if _, err := d.Decode(ctx, change.Origin{Partition: change.Partition{Topic: src.Topic()}}, k, scdtest.Flatten(v, tc.fields...)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v; want an error with %q", tc.what, err, tc.want)
			}
		}
	})
	t.Run("no op and no __deleted", func(t *testing.T) {
		d := debezium.New([]debezium.Rule{{Topic: src.Topic(), Target: "x", SequenceBy: []string{"source.lsn"}, ValidFrom: "source.ts_ms"}}, nil, nil)
		k, _ := src.Envelope(changes[1])
		v := []byte(`{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"id"}],"optional":false,"name":"v"},"payload":{"id":1}}`)
		if _, err := d.Decode(ctx, change.Origin{Partition: change.Partition{Topic: src.Topic()}}, k, v); err == nil || !strings.Contains(err.Error(), "add.fields") {
			t.Errorf("a flattened record without op: %v; want an error naming add.fields", err)
		}
	})
}

// Documents flattened by ExtractNewDocumentState (add.fields
// op,source.ts_ms,source.ord; rewrite deletes, __deleted a boolean, the
// key {"id": <_id>}) become history rows with connector: mongodb: _id the
// key, typed as Debezium's converter types them, a field a document lacks
// null in its version, a delete closing the document's version.
func TestFlattenedDocuments(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t)
	topic := "app.shop.customers"
	field := func(typ, name string) string { return `{"type":"` + typ + `","optional":true,"field":"` + name + `"}` }
	added := field("string", "__op") + "," + field("int64", "__source_ts_ms") + "," + field("int32", "__source_ord") + "," + field("boolean", "__deleted")
	doc := func(fields, payload string, op string, sec, ord int, deleted bool) []byte {
		del := "false"
		if deleted {
			del = "true"
		}
		ts := time.Date(2026, 3, 1, 10, 0, sec, 0, time.UTC).UnixMilli()
		return []byte(`{"schema":{"type":"struct","fields":[` + field("string", "_id") + fields + "," + added + `],"optional":false,"name":"` + topic + `"},` +
			`"payload":{` + payload + `,"__op":"` + op + `","__source_ts_ms":` + strconv.FormatInt(ts, 10) + `,"__source_ord":` + strconv.Itoa(ord) + `,"__deleted":` + del + `}}`)
	}
	key := []byte(`{"schema":{"type":"struct","fields":[{"type":"string","optional":true,"field":"id"}],"optional":false},"payload":{"id":"5d505646cf6d4fe581014ab2"}}`)
	id := `"_id":"5d505646cf6d4fe581014ab2"`
	since := `,{"type":"int64","optional":true,"name":"org.apache.kafka.connect.data.Timestamp","version":1,"field":"since"}`
	recs := [][2][]byte{
		{key, doc(","+field("string", "name")+","+field("int32", "qty")+since, id+`,"name":"Anne","qty":3,"since":1772360130123`, "c", 1, 1, false)},
		{key, doc(","+field("string", "name")+","+field("int32", "qty")+since, id+`,"name":"Anne","qty":4,"since":1772360130123`, "u", 2, 1, false)},
		// $unset qty: the document lacks it.
		{key, doc(","+field("string", "name")+since, id+`,"name":"Anne","since":1772360130123`, "u", 3, 1, false)},
		// A rewritten delete: the key and _id only.
		{key, doc("", id, "d", 4, 1, true)},
	}
	d := debezium.New([]debezium.Rule{{Topic: topic, Target: "docs_history", SequenceBy: config.DefaultSequenceBy["mongodb"],
		ValidFrom: "source.ts_ms", Connector: "mongodb"}}, nil, nil)
	s := newSink(t, pool, sink.TableSpec{Target: "docs_history"})
	if _, err := s.Apply(ctx, sink.Batch{Events: decodeAll(t, d, topic, recs)}); err != nil {
		t.Fatal(err)
	}
	var hist string
	if err := pool.QueryRow(ctx, `SELECT string_agg(concat_ws('|', _id, name, coalesce(qty::text, '-'), since, to_char(valid_from AT TIME ZONE 'UTC', 'SS'),
		coalesce(to_char(valid_to AT TIME ZONE 'UTC', 'SS'), 'open')), ' ' ORDER BY valid_from) FROM docs_history`).Scan(&hist); err != nil {
		t.Fatal(err)
	}
	want := "5d505646cf6d4fe581014ab2|Anne|3|2026-03-01 10:15:30.123|01|02 " +
		"5d505646cf6d4fe581014ab2|Anne|4|2026-03-01 10:15:30.123|02|03 " +
		"5d505646cf6d4fe581014ab2|Anne|-|2026-03-01 10:15:30.123|03|04"
	if hist != want {
		t.Errorf("history:\n got %s\nwant %s", hist, want)
	}
	var cols string
	if err := pool.QueryRow(ctx, `SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = 'docs_history'::regclass
		AND attnum > 0 AND NOT attisdropped AND attname NOT LIKE 'scd%' AND attname NOT IN ('valid_from', 'valid_to', 'is_current')`).Scan(&cols); err != nil || cols != "_id,name,qty,since" {
		t.Errorf("columns %q (%v): want _id,name,qty,since (no id, no __ fields)", cols, err)
	}
}
