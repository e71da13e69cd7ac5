package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	if err := runDemo(context.Background(), &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, line := range []string{
		"C1001        Sarah Meier   basic  Wien      2026-01-01  2026-03-01  false",
		"C1002        Marko Horvat  pro    Graz      2026-02-10  2026-03-01  false",
		"C1004        Liam Novak    team   Wien      2026-05-01              true",
		"-> basic",
		"PostgreSQL: ", // which one it used
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("demo output lacks %q:\n%s", line, out.String())
		}
	}
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
