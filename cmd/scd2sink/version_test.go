package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
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
