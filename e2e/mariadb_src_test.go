//go:build e2e

package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the MariaDB source's client
)

// mariadb is a MariaDB server from Debian's packages, started for one test
// on a private datadir and port: ROW binlog with FULL images and GTIDs,
// strict GTID mode, replicated changes logged too (so that a replica can
// be promoted), the audit database left out of the binlog.
type mariadb struct {
	id   int // server_id
	port int
	sock string
	data string
	proc *proc
	db   *sql.DB
}

// mariadbBin finds a MariaDB program (Debian puts mariadbd in /usr/sbin).
func mariadbBin(t *testing.T, name string) string {
	t.Helper()
	for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	t.Fatalf("%s not found: install Debian's mariadb-server (.ci/run does)", name)
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// startMariaDB initialises and starts a server with the given server_id,
// in time zone zone ("": UTC).
func startMariaDB(t *testing.T, ctx context.Context, dir string, id int, zone ...string) *mariadb {
	t.Helper()
	data := filepath.Join(dir, fmt.Sprintf("mariadb%d", id))
	// The socket's path must stay short (108 bytes).
	sockDir, err := os.MkdirTemp("", "mdb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	m := &mariadb{id: id, port: freePort(t), sock: filepath.Join(sockDir, "sock"), data: data}
	user := []string{}
	if os.Geteuid() == 0 {
		user = []string{"--user=root"}
	}
	start := time.Now()
	install := append([]string{mariadbBin(t, "mariadb-install-db"), "--no-defaults", "--datadir=" + data,
		"--auth-root-authentication-method=normal", "--skip-test-db"}, user...)
	if out, err := exec.Command(install[0], install[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	args := append([]string{mariadbBin(t, "mariadbd"), "--no-defaults", "--datadir=" + data, "--socket=" + m.sock,
		"--port=" + strconv.Itoa(m.port), "--bind-address=127.0.0.1", "--skip-name-resolve",
		"--pid-file=" + filepath.Join(data, "mariadbd.pid"), "--log-error=" + filepath.Join(data, "error.log"),
		"--server-id=" + strconv.Itoa(id), "--log-bin=mysql-bin", "--binlog-format=ROW", "--binlog-row-image=FULL",
		"--log-slave-updates=ON", "--gtid-strict-mode=ON", "--binlog-ignore-db=audit", "--default-time-zone=" + append(zone, "+00:00")[0],
		"--innodb-buffer-pool-size=32M", "--performance-schema=OFF", "--skip-innodb-doublewrite"}, user...)
	m.proc = startProc(t, dir, fmt.Sprintf("mariadb%d", id), args)
	db, err := sql.Open("mysql", "root@unix("+m.sock+")/?multiStatements=true&loc=UTC")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	m.db = db
	if err := waitFor(ctx, 60*time.Second, func() (bool, error) {
		if m.proc.exited() {
			return false, fmt.Errorf("mariadbd exited")
		}
		return db.PingContext(ctx) == nil, nil
	}); err != nil {
		b, _ := os.ReadFile(filepath.Join(data, "error.log"))
		t.Fatalf("MariaDB %d did not start: %v\n%s", id, err, b)
	}
	var version string
	_ = db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version)
	t.Logf("MariaDB %s (server_id %d) up on port %d after %v", version, id, m.port, time.Since(start).Round(time.Millisecond))
	return m
}

// exec runs statements (several, separated by semicolons) on m.
func (m *mariadb) exec(t *testing.T, ctx context.Context, stmts string) {
	t.Helper()
	if _, err := m.db.ExecContext(ctx, stmts); err != nil {
		t.Fatalf("MariaDB %d: %v\n%s", m.id, err, stmts)
	}
}

// gtidPos is the server's position in GTID terms (gtid_binlog_pos on a
// primary, gtid_slave_pos on a replica).
func (m *mariadb) gtidPos(ctx context.Context, variable string) (string, error) {
	var v string
	err := m.db.QueryRowContext(ctx, "SELECT @@"+variable).Scan(&v)
	return v, err
}

// binlogFile is the file the server writes its binlog to now.
func (m *mariadb) binlogFile(t *testing.T, ctx context.Context) string {
	t.Helper()
	rows, err := m.db.QueryContext(ctx, "SHOW MASTER STATUS")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	vals := make([]sql.RawBytes, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if !rows.Next() {
		t.Fatal("SHOW MASTER STATUS: no row")
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	return string(vals[0])
}

// invSchema is the captured table, its grants, and the ground truth: an
// audit trigger per operation writing into audit.log, which the binlog
// leaves out (else the trigger's inserts would split every multi-row
// statement's rows event into one per row). audit.log keeps the new image
// typed as the source holds it, and the statement's time in seconds, as
// MariaDB's binlog (and so Debezium's source.ts_ms) has it.
const invSchema = `
CREATE USER 'dbz'@'%' IDENTIFIED BY 'dbz';
GRANT SELECT, RELOAD, SHOW DATABASES, REPLICATION SLAVE, REPLICATION CLIENT, LOCK TABLES ON *.* TO 'dbz'@'%';
CREATE DATABASE inv;
CREATE TABLE inv.accounts (id INT PRIMARY KEY, plan VARCHAR(16) NOT NULL, qty INT, price DECIMAL(10,2), dur TIME(6), note VARCHAR(40));
CREATE TRIGGER inv.accounts_ai AFTER INSERT ON inv.accounts FOR EACH ROW
	INSERT INTO audit.log (op, ts, old_id, new_id, plan, qty, price, dur, note) VALUES ('I', UNIX_TIMESTAMP(), NULL, NEW.id, NEW.plan, NEW.qty, NEW.price, NEW.dur, NEW.note);
CREATE TRIGGER inv.accounts_au AFTER UPDATE ON inv.accounts FOR EACH ROW
	INSERT INTO audit.log (op, ts, old_id, new_id, plan, qty, price, dur, note) VALUES ('U', UNIX_TIMESTAMP(), OLD.id, NEW.id, NEW.plan, NEW.qty, NEW.price, NEW.dur, NEW.note);
CREATE TRIGGER inv.accounts_ad AFTER DELETE ON inv.accounts FOR EACH ROW
	INSERT INTO audit.log (op, ts, old_id, new_id) VALUES ('D', UNIX_TIMESTAMP(), OLD.id, NULL);
`

// auditSchemaMariaDB is created on every server with the session's binlog
// off: replicated rows fire no trigger on a replica, so a promoted
// replica's log starts empty, with the changes made on it.
const auditSchemaMariaDB = `
SET SESSION sql_log_bin = 0;
CREATE DATABASE audit;
CREATE TABLE audit.log (id BIGINT AUTO_INCREMENT PRIMARY KEY, op CHAR(1) NOT NULL, ts BIGINT NOT NULL, old_id INT, new_id INT,
	plan VARCHAR(16), qty INT, price DECIMAL(10,2), dur TIME(6), note VARCHAR(40));
SET SESSION sql_log_bin = 1;
`

// auditRow is one row of audit.log, its values as text (nil for NULL).
type auditRow struct {
	op            string
	ts            int64
	oldID, newID  *string
	vals          []*string // plan, qty, price, dur, note
	server, entry int
}

// readAudit reads m's audit log in the order it was written (one writer:
// commit order).
func (m *mariadb) readAudit(t *testing.T, ctx context.Context) []auditRow {
	t.Helper()
	rows, err := m.db.QueryContext(ctx, `SELECT op, ts, old_id, new_id, plan, qty, price, CAST(dur AS CHAR), note FROM audit.log ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []auditRow
	for rows.Next() {
		r := auditRow{vals: make([]*string, 5), server: m.id, entry: len(out)}
		dest := []any{&r.op, &r.ts, &r.oldID, &r.newID}
		for i := range r.vals {
			dest = append(dest, &r.vals[i])
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// intervalText spells a MariaDB TIME as PostgreSQL prints the interval
// holding it: "-838:59:59.000000" is "-838:59:59", "00:00:00.500000" is
// "00:00:00.5".
func intervalText(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	whole, frac, _ := strings.Cut(s, ".")
	frac = strings.TrimRight(frac, "0")
	if frac != "" {
		whole += "." + frac
	}
	if neg && strings.Trim(whole, "0:.") != "" {
		return "-" + whole
	}
	return whole
}
