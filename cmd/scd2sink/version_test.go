package main

import (
	"bytes"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/scd2sink/scd2sink/config"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestVersion: `version`, `--version` and `-version` print one line, the
// version and the Go version it was built with, on stdout, and exit 0.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"version", "--version", "-version"} {
		t.Run(arg, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			if code := realMain([]string{arg}, &out, &errOut); code != 0 {
				t.Fatalf("exit %d, stderr %q", code, errOut.String())
			}
			line := out.String()
			if !strings.HasPrefix(line, "scd2sink ") || !strings.HasSuffix(line, runtime.Version()+"\n") || strings.Count(line, "\n") != 1 {
				t.Errorf("printed %q, want one line: scd2sink <version>…, %s", line, runtime.Version())
			}
			if errOut.Len() > 0 {
				t.Errorf("stderr %q, want nothing", errOut.String())
			}
		})
	}
}

// TestLogTimes: log lines carry ISO 8601 times in UTC, not a float epoch.
func TestLogTimes(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"json", "console"} {
		t.Run(format, func(t *testing.T) {
			var buf bytes.Buffer
			log, err := loggerTo(config.Log{Level: "info", Format: format}, zapcore.AddSync(&buf))
			if err != nil {
				t.Fatal(err)
			}
			log.Info("hello", zap.String("k", "v"))
			line := buf.String()
			if !regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z`).MatchString(line) || strings.Contains(line, `"ts":1`) {
				t.Fatalf("log line %q: want an ISO 8601 time", line)
			}
		})
	}
}
