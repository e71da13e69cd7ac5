//go:build e2e

package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/change"
	"github.com/scd2sink/scd2sink/internal/scdtest"
	"github.com/scd2sink/scd2sink/sink"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// typedCol is a column of inv.typed: its MariaDB type, the history
// column's type (DESIGN.md section 4), the audit trigger's text of NEW.x,
// and how that text is spelled as PostgreSQL prints the history's value.
type typedCol struct {
	name, mariaType, pgType, audit string
	pg                             func(string) string
}

func same(s string) string { return s }

// typedCols: every common MySQL/MariaDB type, each nullable.
var typedCols = []typedCol{
	{"flag", "BIT(1)", "boolean", "IF(NEW.flag IS NULL, NULL, IF(NEW.flag+0 = 1, 'true', 'false'))", same},
	{"bits", "BIT(12)", "bytea", "CAST(NEW.bits+0 AS CHAR)", bitsText},
	{"tiny", "TINYINT(1)", "smallint", "CAST(NEW.tiny AS CHAR)", same},
	{"small", "SMALLINT UNSIGNED", "integer", "CAST(NEW.small AS CHAR)", same},
	{"yr", "YEAR", "integer", "CAST(NEW.yr AS CHAR)", same},
	{"ubig", "BIGINT UNSIGNED", "numeric", "CAST(NEW.ubig AS CHAR)", same},
	{"amount", "DECIMAL(12,4)", "numeric", "CAST(NEW.amount AS CHAR)", same},
	{"dt", "DATETIME(6)", "timestamp without time zone", "DATE_FORMAT(NEW.dt, '%Y-%m-%d %H:%i:%s.%f')", trimFraction},
	{"ts", "TIMESTAMP(6) NULL DEFAULT NULL", "timestamp with time zone", "CAST(UNIX_TIMESTAMP(NEW.ts) AS CHAR)", epochText},
	{"d", "DATE", "date", "CAST(NEW.d AS CHAR)", same},
	{"tm", "TIME(6)", "interval", "CAST(NEW.tm AS CHAR)", intervalText},
	{"js", "JSON", "text", "NEW.js", same},
	{"level", "ENUM('low','mid','high')", "text", "CAST(NEW.level AS CHAR)", same},
	{"tags", "SET('x','y','z')", "text", "CAST(NEW.tags AS CHAR)", same},
	{"bl", "BLOB", "bytea", "LOWER(HEX(NEW.bl))", func(s string) string { return `\x` + s }},
	{"dbl", "DOUBLE", "double precision", "CAST(NEW.dbl AS CHAR)", doubleText},
	{"name", "VARCHAR(40) CHARACTER SET utf8mb4", "text", "NEW.name", same},
}

// bitsText is a BIT(12)'s number as Debezium's io.debezium.data.Bits
// bytes (little-endian, two bytes) in bytea's text.
func bitsText(s string) string {
	n, _ := strconv.Atoi(s)
	return fmt.Sprintf(`\x%02x%02x`, n&0xff, n>>8)
}

// doubleText spells a DOUBLE as PostgreSQL prints a double precision: the
// shortest digits ("1e21" is "1e+21").
func doubleText(s string) string {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return s
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// trimFraction spells a DATETIME(6) as PostgreSQL prints a timestamp:
// "…10:00:00.500000" is "…10:00:00.5", "….000000" nothing.
func trimFraction(s string) string {
	whole, frac, _ := strings.Cut(s, ".")
	if frac = strings.TrimRight(frac, "0"); frac != "" {
		return whole + "." + frac
	}
	return whole
}

// epochText spells UNIX_TIMESTAMP's "seconds.micros" as PostgreSQL prints
// a timestamptz in UTC.
func epochText(s string) string {
	sec, frac, _ := strings.Cut(s, ".")
	n, _ := strconv.ParseInt(sec, 10, 64)
	us, _ := strconv.Atoi((frac + "000000")[:6])
	return trimFraction(time.Unix(n, int64(us)*1000).UTC().Format("2006-01-02 15:04:05.000000")) + "+00"
}

func typedNames() []string {
	var out []string
	for _, c := range typedCols {
		out = append(out, c.name)
	}
	return out
}

// typedSchema creates inv.typed (composite key) and its audit triggers
// into audit.tlog (created with the binlog off, as audit.log is).
func typedSchema() string {
	var cols, auditCols, news []string
	for _, c := range typedCols {
		cols = append(cols, c.name+" "+c.mariaType)
		auditCols = append(auditCols, c.name+" TEXT")
		news = append(news, c.audit)
	}
	names := strings.Join(typedNames(), ", ")
	return fmt.Sprintf(`SET SESSION sql_log_bin = 0;
CREATE TABLE audit.tlog (id BIGINT AUTO_INCREMENT PRIMARY KEY, op CHAR(1) NOT NULL, at_s BIGINT NOT NULL,
	old_key VARCHAR(20), new_key VARCHAR(20), %[1]s) DEFAULT CHARSET utf8mb4;
SET SESSION sql_log_bin = 1;
CREATE TABLE inv.typed (region CHAR(2) NOT NULL, id INT NOT NULL, %[2]s, PRIMARY KEY (region, id)) DEFAULT CHARSET utf8mb4;
CREATE TRIGGER inv.typed_ai AFTER INSERT ON inv.typed FOR EACH ROW
	INSERT INTO audit.tlog (op, at_s, old_key, new_key, %[3]s) VALUES ('I', UNIX_TIMESTAMP(), NULL, CONCAT(NEW.region, '|', NEW.id), %[4]s);
CREATE TRIGGER inv.typed_au AFTER UPDATE ON inv.typed FOR EACH ROW
	INSERT INTO audit.tlog (op, at_s, old_key, new_key, %[3]s) VALUES ('U', UNIX_TIMESTAMP(), CONCAT(OLD.region, '|', OLD.id), CONCAT(NEW.region, '|', NEW.id), %[4]s);
CREATE TRIGGER inv.typed_ad AFTER DELETE ON inv.typed FOR EACH ROW
	INSERT INTO audit.tlog (op, at_s, old_key, new_key) VALUES ('D', UNIX_TIMESTAMP(), CONCAT(OLD.region, '|', OLD.id), NULL);
`, strings.Join(auditCols, ", "), strings.Join(cols, ", "), names, strings.Join(news, ", "))
}

// typedWorkload changes inv.typed: inserts with random values of every
// type (NULL among them), updates of one to three columns, multi-row
// updates, deletes, re-inserts and primary-key changes.
type typedWorkload struct {
	rng  *rand.Rand
	live map[[2]any]bool
	gone [][2]any
	next int
}

// value is a random value of column c (nil: NULL).
func (w *typedWorkload) value(c typedCol) any {
	r := w.rng
	if r.IntN(7) == 0 {
		return nil
	}
	switch c.name {
	case "flag":
		return r.IntN(2)
	case "bits":
		return scdtest.Pick(r, 0, 1, 256, 4095, r.IntN(4096))
	case "tiny":
		return r.IntN(11) - 5
	case "small":
		return scdtest.Pick(r, 0, 65535, r.IntN(65536))
	case "yr":
		return scdtest.Pick(r, 1901, 2155, 1999+r.IntN(30))
	case "ubig":
		return scdtest.Pick(r, "0", "9223372036854775808", "18446744073709551615", strconv.Itoa(r.IntN(1e9)))
	case "amount":
		return fmt.Sprintf("%s%d.%04d", scdtest.Pick(r, "", "-"), r.IntN(1e8), r.IntN(1e4))
	case "dt", "ts":
		return fmt.Sprintf("20%02d-%02d-%02d %02d:%02d:%02d.%s", 1+r.IntN(36), 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60),
			scdtest.Pick(r, "000000", "500000", fmt.Sprintf("%06d", r.IntN(1e6))))
	case "d":
		return fmt.Sprintf("%04d-%02d-%02d", scdtest.Pick(r, 1000, 1970, 2026, 9999), 1+r.IntN(12), 1+r.IntN(28))
	case "tm":
		return scdtest.Pick(r, "-838:59:59", "838:59:59", fmt.Sprintf("%d:%02d:%02d.%06d", r.IntN(200), r.IntN(60), r.IntN(60), r.IntN(1e6)))
	case "js":
		return scdtest.Pick(r, `{"a": 1}`, `{"a": 1, "tags": ["x", "y"]}`, `[1, 2, 3]`, `{"k": "naïve ☃"}`, `{}`)
	case "level":
		return scdtest.Pick(r, "low", "mid", "high")
	case "tags":
		return scdtest.Pick(r, "", "x", "x,z", "y,z", "x,y,z")
	case "bl":
		b := make([]byte, r.IntN(7))
		for i := range b {
			b[i] = scdtest.Pick(r, 0x00, 0xff, byte(r.IntN(256)))
		}
		return b
	case "dbl":
		return scdtest.Pick(r, 0.0, 2.5, -0.125, 1024.75, 3.0, 0.1, 1e21, 1.5e-7, 123456.789)
	case "name":
		return scdtest.Pick(r, "", "Anne", `O'Brien "x"`, "naïve ☃ 😀", "tab\there")
	}
	panic(c.name)
}

func (w *typedWorkload) insert(ctx context.Context, tx *sql.Tx, key [2]any) error {
	w.live[key] = true
	args := []any{key[0], key[1]}
	marks := []string{"?", "?"}
	for _, c := range typedCols {
		args = append(args, w.value(c))
		marks = append(marks, "?")
	}
	_, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO inv.typed (region, id, %s) VALUES (%s)", strings.Join(typedNames(), ", "), strings.Join(marks, ", ")), args...)
	return err
}

// anyLive picks a live key, the same for the same seed.
func (w *typedWorkload) anyLive() ([2]any, bool) {
	if len(w.live) == 0 {
		return [2]any{}, false
	}
	keys := make([]string, 0, len(w.live))
	byText := map[string][2]any{}
	for k := range w.live {
		s := fmt.Sprint(k)
		keys = append(keys, s)
		byText[s] = k
	}
	sort.Strings(keys)
	return byText[keys[w.rng.IntN(len(keys))]], true
}

func (w *typedWorkload) statement(ctx context.Context, tx *sql.Tx) error {
	key, ok := w.anyLive()
	p := w.rng.IntN(100)
	switch {
	case !ok || p < 30:
		if len(w.gone) > 0 && w.rng.IntN(3) == 0 {
			key, w.gone = w.gone[0], w.gone[1:]
		} else {
			key, w.next = [2]any{scdtest.Pick(w.rng, "eu", "us"), w.next}, w.next+1
		}
		return w.insert(ctx, tx, key)
	case p < 70:
		var sets []string
		var args []any
		for n := 1 + w.rng.IntN(3); n > 0; n-- {
			c := typedCols[w.rng.IntN(len(typedCols))]
			sets = append(sets, c.name+" = ?")
			args = append(args, w.value(c))
		}
		_, err := tx.ExecContext(ctx, "UPDATE inv.typed SET "+strings.Join(sets, ", ")+" WHERE region = ? AND id = ?", append(args, key[0], key[1])...)
		return err
	case p < 75: // one rows event of several rows
		_, err := tx.ExecContext(ctx, "UPDATE inv.typed SET tiny = IF(tiny > 100, 0, tiny + 1), dbl = 2.5 WHERE region = ?", key[0])
		return err
	case p < 90:
		delete(w.live, key)
		w.gone = append(w.gone, key)
		_, err := tx.ExecContext(ctx, "DELETE FROM inv.typed WHERE region = ? AND id = ?", key[0], key[1])
		return err
	default: // a primary-key change
		to := [2]any{"ap", w.next}
		w.next++
		delete(w.live, key)
		w.live[to] = true
		w.gone = append(w.gone, key)
		_, err := tx.ExecContext(ctx, "UPDATE inv.typed SET region = ?, id = ? WHERE region = ? AND id = ?", to[0], to[1], key[0], key[1])
		return err
	}
}

func (w *typedWorkload) run(ctx context.Context, db *sql.DB, n int, at func(i int)) error {
	for i := 0; i < n; i++ {
		at(i)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		for k := 1 + w.rng.IntN(3); k > 0; k-- {
			if err := w.statement(ctx, tx); err != nil {
				tx.Rollback()
				return fmt.Errorf("transaction %d: %w", i, err)
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// typedAudit is audit.tlog: the truth as events (values spelled as
// PostgreSQL prints them), and the last image of every key.
func typedAudit(t *testing.T, ctx context.Context, m *mariadb, spec sink.TableSpec) (evs []*change.Event, last map[string][]*string) {
	t.Helper()
	rows, err := m.db.QueryContext(ctx, fmt.Sprintf("SELECT op, at_s, old_key, new_key, %s FROM audit.tlog ORDER BY id", strings.Join(typedNames(), ", ")))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	last = map[string][]*string{}
	for rows.Next() {
		var op string
		var ts int64
		var oldKey, newKey *string
		vals := make([]*string, len(typedCols))
		dest := []any{&op, &ts, &oldKey, &newKey}
		for i := range vals {
			dest = append(dest, &vals[i])
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		for i, c := range typedCols {
			if vals[i] != nil {
				s := c.pg(*vals[i])
				vals[i] = &s
			}
		}
		add := func(o change.Op, key string) {
			region, id, _ := strings.Cut(key, "|")
			ev := &change.Event{Table: spec.Target, Key: []any{region, id}, Seq: change.MustSeq(int64(len(evs) + 1)), Op: o, ValidFrom: time.Unix(ts, 0).UTC()}
			if o.HasAfter() {
				ev.After = map[string]any{"region": region, "id": id}
				for i, c := range typedCols {
					if vals[i] == nil {
						ev.After[c.name] = nil
					} else {
						ev.After[c.name] = *vals[i]
					}
				}
				last[key] = vals
			} else {
				delete(last, key)
			}
			evs = append(evs, ev)
		}
		switch {
		case op == "I":
			add(change.OpCreate, *newKey)
		case op == "U" && *oldKey != *newKey:
			add(change.OpDelete, *oldKey)
			add(change.OpCreate, *newKey)
		case op == "U":
			add(change.OpUpdate, *newKey)
		default:
			add(change.OpDelete, *oldKey)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return evs, last
}

// typedConnector captures inv.typed into topics prefixed prefix, with
// converter properties of its own ("" keeps the worker's JSON).
func typedConnector(dir string, port, serverID int, prefix, converters string) string {
	return fmt.Sprintf(`name=%[3]s-source
connector.class=io.debezium.connector.mariadb.MariaDbConnector
tasks.max=1
database.hostname=127.0.0.1
database.port=%[1]d
database.user=dbz
database.password=dbz
database.server.id=%[2]d
topic.prefix=%[3]s
database.include.list=inv
table.include.list=inv.typed
include.schema.changes=false
schema.history.internal=io.debezium.storage.file.history.FileSchemaHistory
schema.history.internal.file.filename=%[4]s
snapshot.mode=initial
bigint.unsigned.handling.mode=precise
%[5]s`, port, serverID, prefix, filepath.Join(dir, prefix+"-schema-history.dat"), converters)
}

// TestMariaDBTypes: every common MySQL/MariaDB type (BIT(1), BIT(n),
// TINYINT(1), unsigned integers, YEAR, DECIMAL, DATETIME(6), TIMESTAMP(6),
// DATE, TIME beyond 24 hours, JSON, ENUM, SET, BLOB, DOUBLE, utf8mb4 text)
// in a table with a composite key, captured by Debezium's MariaDB connector
// twice: through the JsonConverter with schemas and through Apicurio's
// AvroConverter. Both histories equal the fold of the source's audit log,
// value for value, with the column types of DESIGN.md section 4; the
// snapshot's rows are current with their values; scd2sink and Connect are
// SIGKILLed mid-workload; nothing is dead-lettered.
func TestMariaDBTypes(t *testing.T) {
	skipOnCompose(t)
	ctx := context.Background()
	dir := t.TempDir()
	writeLog4j(t, cache)
	// Not UTC: DATETIME is a local time without a zone, TIMESTAMP an
	// instant, and the snapshot reads both through JDBC.
	db := startMariaDB(t, ctx, dir, 1, "+02:00")
	db.exec(t, ctx, auditSchemaMariaDB)
	db.exec(t, ctx, invSchema)
	db.exec(t, ctx, typedSchema())
	w := &typedWorkload{rng: rand.New(rand.NewPCG(7, 7)), live: map[[2]any]bool{}, next: 1}
	// The snapshot's rows (region sn), checked by value: their history
	// starts when the snapshot read them.
	tx, err := db.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 6; i++ {
		if err := w.insert(ctx, tx, [2]any{"sn", i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	w.live = map[[2]any]bool{}

	port, release := reservePort(t)
	api := fmt.Sprintf("http://127.0.0.1:%d/apis/registry/v2", port)
	reg := startApicurio(t, dir, port, release)
	target := startTarget(t, ctx)
	kafka := startBroker(t, cache, dir)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.addr()))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, 2, 1, nil, "inv.inv.typed", "inva.inv.typed")
	cl.Close()
	if err != nil || resp.Error() != nil {
		t.Fatalf("creating the topics: %v %v", err, resp.Error())
	}
	var avro string
	for _, side := range []string{"key", "value"} {
		avro += fmt.Sprintf("%[1]s.converter=io.apicurio.registry.utils.converter.AvroConverter\n%[1]s.converter.apicurio.registry.url=%[2]s\n"+
			"%[1]s.converter.apicurio.registry.auto-register=true\n%[1]s.converter.apicurio.registry.find-latest=true\n", side, api)
	}
	conn := startConnector(t, cache, dir, kafka.addr(), typedConnector(dir, db.port, 5401, "inv", "")+"\n---\n"+typedConnector(dir, db.port, 5402, "inva", avro),
		"", mariadbDebezium+", JSON and Avro")
	tablesYAML := fmt.Sprintf(`schema_registry:
  kind: apicurio
  url: %q
defaults:
  connector: mariadb
tables:
  - topic: inv.inv.typed
    target: typed_json
  - topic: inva.inv.typed
    target: typed_avro
    format: debezium-avro
`, api)
	sinkProc := runSinkTables(t, dir, "scd2sink", kafka.addr(), target.dsn, tablesYAML)
	specs := []sink.TableSpec{{Target: "typed_json", Schema: "public", Keys: []string{"region", "id"}},
		{Target: "typed_avro", Schema: "public", Keys: []string{"region", "id"}}}
	for _, spec := range specs {
		var n int
		if err := waitFor(ctx, 120*time.Second, func() (bool, error) {
			err := target.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE region = 'sn' AND is_current`, spec.Target)).Scan(&n)
			return n == 6, err
		}); err != nil {
			t.Fatalf("%s: the snapshot's 6 rows never reached the history (%d did): %v\n%s\n%s\n%s", spec.Target, n, err, sinkProc.tail(20), conn.proc.tail(30), reg.tail(10))
		}
	}
	err = w.run(ctx, db.db, 70, func(i int) {
		switch i {
		case 20:
			sinkProc.kill()
			sinkProc = runSinkTables(t, dir, "scd2sink", kafka.addr(), target.dsn, tablesYAML)
		case 35:
			db.exec(t, ctx, "FLUSH BINARY LOGS")
		case 45:
			// Connect is killed once both connectors have flushed an
			// offset of their streaming: a connector killed while its last
			// flushed offset is its snapshot's snapshots again, and the
			// changes in between are history Debezium never sends.
			if err := waitFor(ctx, 60*time.Second, func() (bool, error) {
				b, err := os.ReadFile(filepath.Join(dir, "connect.offsets"))
				return streamingOffset(b, "inv") && streamingOffset(b, "inva"), err
			}); err != nil {
				t.Fatalf("Connect never flushed both connectors' streaming offsets: %v", err)
			}
			conn.proc.kill()
			conn.start(t, dir, cache)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	cols := typedNames()
	for _, spec := range specs {
		evs, last := typedAudit(t, ctx, db, spec)
		var workload []*change.Event
		for _, ev := range evs {
			if ev.Key[0] != "sn" {
				workload = append(workload, ev)
			}
		}
		want := stripSeq(scdtest.ModelLines(spec, cols, scdtest.Fold(spec, cols, workload)))
		var got []string
		if err := waitFor(ctx, 120*time.Second, func() (bool, error) {
			got = nil
			for _, l := range stripSeq(scdtest.HistoryLines(t, target.pool, spec, cols)) {
				if !strings.HasPrefix(l, "sn|") {
					got = append(got, l)
				}
			}
			return scdtest.DiffLines(want, got) == "", nil
		}); err != nil {
			if keep := os.Getenv("E2E_KEEP"); keep != "" {
				_ = exec.Command("cp", "-r", dir, keep).Run()
			}
			t.Fatalf("%s: the history never matched the audit log (%d versions expected, %d got): %v\n%s\n%s\n%s", spec.Target, len(want), len(got), err,
				scdtest.DiffLines(want, got), sinkProc.tail(20), conn.proc.tail(20))
		}
		// The snapshot's rows: current, with the audit log's last values.
		var wantSnap, gotSnap []string
		for key, vals := range last {
			if strings.HasPrefix(key, "sn|") {
				var vs []string
				for i, c := range cols {
					vs = append(vs, c+"="+textOr(vals[i]))
				}
				wantSnap = append(wantSnap, key+" "+strings.Join(vs, " "))
			}
		}
		sel := []string{"region || '|' || id"}
		for _, c := range cols {
			sel = append(sel, fmt.Sprintf("'%[1]s=' || coalesce(%[1]s::text, '∅')", c))
		}
		rows, err := target.pool.Query(ctx, fmt.Sprintf(`SELECT concat_ws(' ', %s) FROM %s WHERE region = 'sn' AND is_current`, strings.Join(sel, ", "), spec.Target))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var l string
			if err := rows.Scan(&l); err != nil {
				t.Fatal(err)
			}
			gotSnap = append(gotSnap, l)
		}
		rows.Close()
		sort.Strings(wantSnap)
		sort.Strings(gotSnap)
		if d := scdtest.DiffLines(wantSnap, gotSnap); d != "" {
			t.Errorf("%s: the snapshot's rows:\n%s", spec.Target, d)
		}
		// Column types, per DESIGN.md section 4.
		for _, c := range append([]typedCol{{name: "region", pgType: "text"}, {name: "id", pgType: "integer"}}, typedCols...) {
			var typ string
			if err := target.pool.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2`,
				spec.Target, c.name).Scan(&typ); err != nil || typ != c.pgType {
				t.Errorf("%s: column %s (%s) is %q (%v), want %s", spec.Target, c.name, c.mariaType, typ, err, c.pgType)
			}
		}
		t.Logf("%s: history equals the audit log, %d versions, and the snapshot's %d rows", spec.Target, len(want), len(wantSnap))
	}
	var dead int
	if err := target.pool.QueryRow(ctx, `SELECT count(*) FROM scd2sink_dead_letters`).Scan(&dead); err != nil || dead != 0 {
		t.Errorf("%d dead letters (%v)", dead, err)
	}
	sinkProc.stop(30 * time.Second)
	if b, _ := os.ReadFile(sinkProc.log); strings.Contains(string(b), "dead-lettered") {
		t.Errorf("scd2sink logged a dead letter:\n%s", sinkProc.tail(30))
	}
}

// streamingOffset says whether Connect's offsets file (Java-serialized
// JSON strings) holds an offset of the prefix's connector from its binlog
// streaming (it names the event within the transaction), not from its
// snapshot.
func streamingOffset(file []byte, prefix string) bool {
	_, rest, ok := strings.Cut(string(file), `"`+prefix+`-source",{"server":"`+prefix+`"}]`)
	if !ok {
		return false
	}
	start := strings.IndexByte(rest, '{')
	end := strings.IndexByte(rest, '}')
	return start >= 0 && end > start && strings.Contains(rest[start:end], `"event"`) && !strings.Contains(rest[start:end], `"snapshot"`)
}

func textOr(p *string) string {
	if p == nil {
		return "∅"
	}
	return *p
}
