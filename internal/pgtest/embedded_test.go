package pgtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestEmbedded starts the embedded PostgreSQL the way this process would,
// even where local binaries exist: as root, with its server run as the
// unprivileged user embeddedUser picks (startEmbeddedAs); otherwise through
// embedded-postgres as this user. Either way the data directory and the
// server's processes belong to that uid, never root's, and Stop stops the
// server and removes its directory, binaries and data.
func TestEmbedded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var c *Cluster
	var err error
	wantUID := os.Geteuid()
	if wantUID == 0 {
		u, err := embeddedUser()
		if err != nil {
			t.Fatal(err)
		}
		if wantUID, err = strconv.Atoi(u.Uid); err != nil {
			t.Fatal(err)
		}
		c, err = startEmbeddedAs(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("as root: the server runs as %s (uid %d)", u.Username, wantUID)
	} else if c, err = startEmbedded(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop()
		}
	}()
	if wantUID == 0 {
		t.Fatal("the embedded server would run as root")
	}
	if !strings.HasPrefix(c.Kind, "embedded PostgreSQL") {
		t.Errorf("Kind = %q", c.Kind)
	}

	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var data string
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.current_setting('data_directory'), pg_catalog.pg_backend_pid()").Scan(&data, &backend); err != nil {
		t.Fatal(err)
	}
	// The backend exits with its connection: closed after its uids are read.
	defer conn.Close(ctx)
	if uid := ownerOf(t, data); uid != wantUID {
		t.Errorf("data directory %s belongs to uid %d, want %d", data, uid, wantUID)
	}
	pidFile, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	postmaster, err := strconv.Atoi(string(bytes.TrimSpace(bytes.SplitN(pidFile, []byte("\n"), 2)[0])))
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	for _, p := range []struct {
		what string
		pid  int
	}{{"postmaster", postmaster}, {"backend", backend}} {
		if uids := processUIDs(t, p.pid); uids != [4]int{wantUID, wantUID, wantUID, wantUID} {
			t.Errorf("%s %d runs as uids %v (real, effective, saved, filesystem), want %d", p.what, p.pid, uids, wantUID)
		}
	}

	// The server's own temporary directory: the top of data's path under
	// the temporary directory (scd2sink-epg-…), binaries and log included.
	top := data
	for tmp := filepath.Clean(os.TempDir()); filepath.Dir(top) != tmp; top = filepath.Dir(top) {
		if top == filepath.Dir(top) {
			t.Fatalf("data directory %s is not under %s", data, tmp)
		}
	}
	if !strings.HasPrefix(filepath.Base(top), "scd2sink-epg-") {
		t.Fatalf("data directory %s is not in a directory of the embedded server's", data)
	}
	c.Stop()
	stopped = true
	if _, err := os.Stat(top); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Stop, %s: %v (want it removed)", top, err)
	}
	short, cancelShort := context.WithTimeout(ctx, 5*time.Second)
	defer cancelShort()
	if conn, err := pgx.Connect(short, c.DSN("postgres")); err == nil {
		conn.Close(ctx)
		t.Error("the server still answers after Stop")
	}
}

// ownerOf is the uid that owns path.
func ownerOf(t *testing.T, path string) int {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatalf("%s: no owner in %T", path, fi.Sys())
	}
	return int(st.Uid)
}

// processUIDs is a process's real, effective, saved and filesystem uids
// (the Uid line of /proc/<pid>/status).
func processUIDs(t *testing.T, pid int) [4]int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) != 5 || fields[0] != "Uid:" {
			continue
		}
		var uids [4]int
		for i := range uids {
			if uids[i], err = strconv.Atoi(fields[i+1]); err != nil {
				t.Fatalf("/proc/%d/status: %v", pid, err)
			}
		}
		return uids
	}
	t.Fatalf("/proc/%d/status has no Uid line (%v)", pid, s.Err())
	return [4]int{}
}
