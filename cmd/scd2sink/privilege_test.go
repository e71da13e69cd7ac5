package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// psql finds the psql client (Debian's postgresql-client).
func psql(t *testing.T) string {
	t.Helper()
	runs := func(p string) bool { return exec.Command(p, "--version").Run() == nil }
	if p, err := exec.LookPath("psql"); err == nil && runs(p) {
		return p
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql"); len(m) > 0 && runs(m[len(m)-1]) {
		return m[len(m)-1]
	}
	// deploy/least-privilege.sql is a psql script (variables, ON_ERROR_STOP):
	// a machine with Go alone (the embedded PostgreSQL) has no psql to run it.
	t.Skip("psql not found (install postgresql-client): the least-privilege script is run by psql")
	return ""
}

// asRole is dsn with another user and password.
func asRole(t *testing.T, dsn, role, password string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	return u.String()
}

// TestLeastPrivilege runs deploy/least-privilege.sql as an administrator,
// then the service as the role it creates (no superuser, no CREATEDB, no
// CREATE on the database, owning only what it creates): run, verify,
// history and rebuild work; an analyst granted the reporting role reads
// the history, _current, a configured view and _as_of, also after the
// rebuild, and writes nothing. A missing grant (the service pointed at a
// schema it may not create) is one clear error and a wait, not a crash
// loop, and the grant made live is picked up.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	suffix := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	svc, reader, analyst, nobody := "svc_"+suffix, "reader_"+suffix, "analyst_"+suffix, "nobody_"+suffix
	var adminDSN string
	t.Cleanup(func() { // after the test database is dropped (cleanups run last first)
		conn, err := pgx.Connect(ctx, adminDSN)
		if err != nil {
			t.Logf("dropping roles: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, r := range []string{analyst, nobody, reader, svc} {
			if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{r}.Sanitize()); err != nil {
				t.Logf("dropping role %s: %v", r, err)
			}
		}
	})
	r := newCrashRig(t, 8, 30, 2)
	dsn := r.pool.Config().ConnString()
	u, _ := url.Parse(dsn)
	u.Path = "/postgres"
	adminDSN = u.String()

	out, err := exec.Command(psql(t), dsn, "-X", "-q", "-v", "schema=history", "-v", "service_role="+svc,
		"-v", "service_password=s3cret'pw", "-v", "reader_role="+reader, "-f", "../../deploy/least-privilege.sql").CombinedOutput()
	if err != nil {
		t.Fatalf("deploy/least-privilege.sql: %v\n%s", err, out)
	}
	for _, q := range []string{
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'a'; GRANT %s TO %s", pgx.Identifier{analyst}.Sanitize(),
			pgx.Identifier{reader}.Sanitize(), pgx.Identifier{analyst}.Sanitize()),
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'n'", pgx.Identifier{nobody}.Sanitize()),
	} {
		if _, err := r.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var super, createdb, dbCreate bool
	if err := r.pool.QueryRow(ctx, `SELECT rolsuper, rolcreatedb, has_database_privilege($1, current_database(), 'CREATE')
		FROM pg_roles WHERE rolname = $1`, svc).Scan(&super, &createdb, &dbCreate); err != nil {
		t.Fatal(err)
	}
	if super || createdb || dbCreate {
		t.Fatalf("the service role may do too much: superuser %v, createdb %v, CREATE on the database %v", super, createdb, dbCreate)
	}

	// The service, as its role, in schema history.
	r.configure(t, fmt.Sprintf("dsn: %q", dsn), fmt.Sprintf("dsn: %q", asRole(t, dsn, svc, "s3cret'pw")))
	r.configure(t, "  schema: public\n", "  schema: history\n")
	r.configure(t, "  - topic: src.item\n", "    views:\n      - name: dim_acct\n        columns: {scd_id: acct_key}\n  - topic: src.item\n")
	for i := range r.sc.Specs {
		r.sc.Specs[i].Schema = "history"
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = "history"
	admin, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	r.pool = admin

	r.produceSync(t, r.recs)
	cmd, stderr := r.start(t)
	r.waitApplied(t, r.total, 60*time.Second, cmd, stderr)
	r.stop(t, cmd, stderr)
	r.check(t)
	var owners []string
	if err := admin.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT pg_get_userbyid(relowner)::text), '{}') FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'history'`).Scan(&owners); err != nil {
		t.Fatal(err)
	}
	if len(owners) != 1 || owners[0] != svc {
		t.Errorf("objects in schema history are owned by %v, want only %s", owners, svc)
	}

	if code, stdout, errOut := run(t, "verify", "--config", r.cfgFile); code != 0 {
		t.Errorf("verify as the service role: exit %d\n%s%s", code, stdout, errOut)
	}

	// An analyst with the reporting role reads everything the service made
	// for readers, and writes nothing.
	analystCfg := filepath.Join(t.TempDir(), "analyst.yaml")
	raw, _ := os.ReadFile(r.cfgFile)
	if err := os.WriteFile(analystCfg, []byte(strings.Replace(string(raw), asRole(t, dsn, svc, "s3cret'pw"), asRole(t, dsn, analyst, "a"), 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	reads := func(stage string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, asRole(t, dsn, analyst, "a"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		for _, q := range []string{
			"SELECT count(*) FROM history.acct_history",
			"SELECT count(*) FROM history.acct_history_current",
			"SELECT count(*) FROM history.acct_history_as_of(now())",
			"SELECT count(acct_key) FROM history.dim_acct",
			"SELECT count(*) FROM history.item_history_as_of(now())",
		} {
			var n int64
			if err := conn.QueryRow(ctx, q).Scan(&n); err != nil || n == 0 {
				t.Errorf("%s: analyst: %s: %d rows, %v", stage, q, n, err)
			}
		}
		if _, err := conn.Exec(ctx, "DELETE FROM history.acct_history"); err == nil || !strings.Contains(err.Error(), "42501") {
			t.Errorf("%s: the analyst may delete history: %v", stage, err)
		}
		key := ""
		for _, ev := range r.sc.Events {
			if ev.Table == "acct_history" && ev.Key != nil {
				key = ev.Key[0].(string)
				break
			}
		}
		if code, stdout, errOut := run(t, "history", "--config", analystCfg, "--table", "acct_history", "--key", key); code != 0 || !strings.Contains(stdout, key) {
			t.Errorf("%s: history as the analyst: exit %d\n%s%s", stage, code, stdout, errOut)
		}
	}
	reads("after run")

	if code, stdout, errOut := run(t, "rebuild", "--config", r.cfgFile); code != 0 {
		t.Fatalf("rebuild as the service role: exit %d\n%s%s", code, stdout, errOut)
	}
	r.check(t)
	reads("after rebuild")

	// A role without the grants: one clear error, exit 1.
	nobodyCfg := filepath.Join(t.TempDir(), "nobody.yaml")
	if err := os.WriteFile(nobodyCfg, []byte(strings.Replace(string(raw), asRole(t, dsn, svc, "s3cret'pw"), asRole(t, dsn, nobody, "n"), 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, "history", "--config", nobodyCfg, "--table", "acct_history", "--key", "x"); code != 1 || !strings.Contains(errOut, "permission denied") {
		t.Errorf("history without grants: exit %d, %q", code, errOut)
	}

	// The service pointed at a schema it may not create: it waits with one
	// clear error, and goes on once an administrator creates the schema.
	r.configure(t, "  schema: history\n", "  schema: reports\n")
	cmd, stderr = r.start(t)
	time.Sleep(3 * time.Second)
	if cmd.ProcessState != nil {
		t.Fatalf("exited without the grant: %s\n%s", cmd.ProcessState, stderr)
	}
	if s := stderr.String(); !strings.Contains(s, "42501") || !strings.Contains(s, "privilege") {
		t.Errorf("no clear error for the missing grant:\n%s", s)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE SCHEMA reports; GRANT USAGE, CREATE ON SCHEMA reports TO %s", pgx.Identifier{svc}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(45 * time.Second)
	for {
		var ok bool
		if err := admin.QueryRow(ctx, "SELECT to_regclass('reports.scd2sink_offsets') IS NOT NULL").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the grant made live was not picked up\n%s", stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.stop(t, cmd, stderr)
}
