package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	shared    *Cluster
	sharedErr error
	once      sync.Once
	dbCounter atomic.Int64
)

// Main runs a test binary's tests and stops the shared cluster afterwards.
// Use it from TestMain: func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }.
func Main(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		shared.Stop()
	}
	return code
}

func cluster(t testing.TB) *Cluster {
	t.Helper()
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared, sharedErr = Start(ctx)
	})
	if sharedErr != nil {
		t.Fatalf("PostgreSQL for tests: %v", sharedErr)
	}
	return shared
}

var unsafeChars = regexp.MustCompile(`[^a-z0-9_]+`)

// NewDatabase gives the test a fresh database on the shared throwaway server
// and returns its DSN; the database is dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	c := cluster(t)
	name := fmt.Sprintf("t%d_%d_%s", os.Getpid(), dbCounter.Add(1),
		unsafeChars.ReplaceAllString(strings.ToLower(t.Name()), "_"))
	if len(name) > 60 {
		name = name[:60]
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, err := c.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatalf("PostgreSQL for tests: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.DropDatabase(ctx, name); err != nil {
			t.Logf("dropping test database %s: %v", name, err)
		}
	})
	return dsn
}

// CopyDatabase makes a copy of the test database at dsn (CREATE DATABASE
// … TEMPLATE, as a backup restored would be) and returns the copy's DSN;
// sessions connected to the original are terminated first (a template
// must have none). The copy is dropped when the test ends.
func CopyDatabase(t testing.TB, dsn string) string {
	t.Helper()
	c := cluster(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("copying database: %v", err)
	}
	from := strings.TrimPrefix(u.Path, "/")
	name := fmt.Sprintf("t%d_%d_copy", os.Getpid(), dbCounter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.base.String())
	if err != nil {
		t.Fatalf("copying database: %v", err)
	}
	defer conn.Close(ctx)
	for attempt := 0; ; attempt++ {
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, from); err != nil {
			t.Fatalf("copying database: %v", err)
		}
		_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{from}.Sanitize())
		if err == nil {
			break
		}
		if attempt >= 20 { // a pool reconnecting in between
			t.Fatalf("copying database %s: %v", from, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.DropDatabase(ctx, name); err != nil {
			t.Logf("dropping test database %s: %v", name, err)
		}
	})
	return c.DSN(name)
}
