package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scd2sink/scd2sink/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := realMain(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestUsageAndVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage"},
		{[]string{"bogus"}, 2, "unknown command"},
		{[]string{"version"}, 0, "scd2sink dev"},
		{[]string{"run", "--nope"}, 2, "scd2sink run: unknown flag --nope (see scd2sink run --help)"},
		{[]string{"histroy"}, 2, "did you mean history?"},
		{[]string{"--version"}, 0, "scd2sink dev"},
		{[]string{"run", "--config", "/does/not/exist.yaml"}, 2, "cannot read"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := run(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errOut, tc.want) {
				t.Fatalf("exit %d, out %q, err %q; want exit %d mentioning %q", code, out, errOut, tc.code, tc.want)
			}
		})
	}
}

// TestCommandHelp: each command's --help (and help COMMAND) says what it does,
// its flags, an example and its exit codes, on stdout, exit 0; a wrong or
// missing flag is one line on stderr with where help is, exit 2.
func TestCommandHelp(t *testing.T) {
	t.Parallel()
	for _, c := range commands {
		for _, args := range [][]string{append(strings.Fields(c.name), "--help"), append([]string{"help"}, strings.Fields(c.name)...), append(strings.Fields(c.name), "-h")} {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				code, out, errOut := run(t, args...)
				if c.name == "version" || c.name == "help" {
					return // version prints the version, help the list, whatever follows (TestHelp)
				}
				if code != 0 || errOut != "" {
					t.Fatalf("exit %d, stderr %q", code, errOut)
				}
				for _, want := range []string{"usage: scd2sink " + c.name, "example:\n  scd2sink ", "exit codes:\n  0  "} {
					if !strings.Contains(out, want) {
						t.Errorf("help lacks %q:\n%s", want, out)
					}
				}
				if strings.Contains(c.synopsis, "--config") && !strings.Contains(out, "flags:\n") {
					t.Errorf("help lists no flags:\n%s", out)
				}
			})
		}
	}
	f := filepath.Join(t.TempDir(), "scd2sink.yaml")
	if err := os.WriteFile(f, []byte("kafka: {brokers: [\"127.0.0.1:9092\"]}\npostgres: {dsn: \"postgres://u@127.0.0.1:1/db\"}\ntables: [{topic: a.b.c}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"history", "--config", f, "--table", "c"}, "scd2sink history: --table and --key are required (see scd2sink history --help)\n"},
		{[]string{"init"}, "scd2sink init: --brokers is required (see scd2sink init --help)\n"},
		{[]string{"verify", "--config", f, "extra"}, "scd2sink verify: unexpected argument \"extra\" (see scd2sink verify --help)\n"},
		{[]string{"dead-letters"}, "scd2sink dead-letters: say list or replay (see scd2sink dead-letters list --help)\n"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := run(t, tc.args...)
			if code != 2 || out != "" || errOut != tc.want {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and stderr %q", code, out, errOut, tc.want)
			}
		})
	}
}

// TestBadConfigExits2 runs the command on configurations with one bad key
// each: exit 2, the key named, the password never printed.
func TestBadConfigExits2(t *testing.T) {
	t.Parallel()
	base := "kafka:\n  brokers: [\"127.0.0.1:9092\"]\npostgres:\n  dsn: \"postgres://u:hunter2@127.0.0.1:1/db\"\ntables:\n  - topic: a.b.c\n"
	tests := []struct{ name, yaml, key string }{
		{"typo", base + "sequencer:\n  reorder_windw: 1s\n", "reorder_windw"},
		{"bad scope", base + "    type1_scope: sometimes\n", "tables[0].type1_scope"},
		{"bad duration", base + "shutdown_timeout: forever\n", "shutdown_timeout"},
		{"bad level", base + "log:\n  level: chatty\n", "log.level"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "scd2sink.yaml")
			if err := os.WriteFile(f, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, cmd := range []string{"run", "verify"} {
				code, out, errOut := run(t, cmd, "--config", f)
				if code != 2 || !strings.Contains(errOut, tc.key) || strings.Contains(out+errOut, "hunter2") {
					t.Fatalf("%s: exit %d, stderr %q; want exit 2 naming %s", cmd, code, errOut, tc.key)
				}
			}
		})
	}
}

func TestDemo(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := runDemo(context.Background(), &out, false); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, line := range []string{
		"C1001        Sarah Meier   basic  Wien      2026-01-01  2026-03-01  false",
		"C1002        Marko Horvat  pro    Graz      2026-02-10  2026-03-01  false",
		"C1004        Liam Novak    team   Wien      2026-05-01              true",
		"-> basic",
		"PostgreSQL: ",                // which one it used
		"track_history: [plan, city]", // the configuration it runs
		`C1001 version 1: name="Sara Meier" plan=basic`,                                  // before the Type 1 fix
		`C1001 version 1: name="Sarah Meier" plan=basic city=Wien valid_from=2026-01-01`, // after it: the same version
		"customers_history_as_of('2026-02-15')",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("demo output lacks %q:\n%s", line, out.String())
		}
	}
}

// TestDemoServes: with serve the demo keeps the service running after
// its story, says where its status page is, serves it, and stops
// cleanly when told to.
func TestDemoServes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() { done <- runDemo(ctx, &out, true) }()
	addr := regexp.MustCompile(`the status page +http://([0-9.:]+)/`)
	var m []string
	for deadline := time.Now().Add(2 * time.Minute); m == nil; time.Sleep(100 * time.Millisecond) {
		if m = addr.FindStringSubmatch(out.String()); m == nil && time.Now().After(deadline) {
			t.Fatalf("the demo never said where its status page is:\n%s", out.String())
		}
	}
	resp, err := http.Get("http://" + m[1] + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "customers_history") {
		t.Fatalf("status page: %d\n%s", resp.StatusCode, page)
	}
	for _, want := range []string{"/metrics", "psql 'postgres://", "scd2sink history --config ", "Ctrl-C"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's invitation lacks %q", want)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the demo did not stop")
	}
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestEraseArguments: erase refuses, with exit 2 and the reason, what it
// cannot do before it touches anything: no erasure_key_file (the
// erasures are keyed hashes), a secret too short, no key, a --key-json
// that is not an array of values.
func TestEraseArguments(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("tooshort"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "kafka:\n  brokers: [\"127.0.0.1:9092\"]\npostgres:\n  dsn: \"postgres://u:hunter2@127.0.0.1:1/db\"\ntables:\n  - topic: a.b.c\n"
	write := func(name, yaml string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	noKey, shortKey := write("nokey.yaml", base), write("short.yaml", base+"erasure_key_file: "+short+"\n")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no erasure_key_file", []string{"--config", noKey, "--table", "c", "--key", "C1"}, "erasure_key_file"},
		{"no erasure_key_file, key-json", []string{"--config", noKey, "--table", "c", "--key-json", `["Smith, J", 7]`}, "erasure_key_file"},
		{"secret too short", []string{"--config", shortKey, "--table", "c", "--key", "C1"}, "erasure_key_file"},
		{"no key", []string{"--config", noKey, "--table", "c"}, "--table and --key are required"},
		{"key-json not an array", []string{"--config", noKey, "--table", "c", "--key-json", `"C1"`}, "JSON array"},
		{"key-json null", []string{"--config", noKey, "--table", "c", "--key-json", `[null]`}, "is null"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := run(t, append([]string{"erase"}, tc.args...)...)
			if code != 2 || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, out %q, err %q; want exit 2 mentioning %q", code, out, errOut, tc.want)
			}
		})
	}
}

func TestJSONKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{`["Smith, J", 7]`, []string{"Smith, J", "7"}},
		{`[true, "x"]`, []string{"true", "x"}},
		{`[12345678901234567890]`, []string{"12345678901234567890"}},
	} {
		got, err := jsonKey(tc.in)
		if err != nil || strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("jsonKey(%s) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
