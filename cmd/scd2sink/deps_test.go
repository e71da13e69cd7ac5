package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryLinksNoDocker: the binary's packages include neither
// testcontainers nor a Docker client: the demo starts PostgreSQL from
// local binaries or the embedded server (pgtest), and only tests can start
// it in Docker (pgtest/pgcontainer).
func TestBinaryLinksNoDocker(t *testing.T) {
	t.Parallel()
	// (go test puts its own toolchain first on the PATH.)
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	var bad []string
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "testcontainers") || strings.Contains(pkg, "github.com/docker/") || strings.HasSuffix(pkg, "/pgcontainer") {
			bad = append(bad, pkg)
		}
	}
	if len(bad) > 0 {
		t.Errorf("the binary depends on %d Docker packages, e.g. %s", len(bad), strings.Join(bad[:min(3, len(bad))], ", "))
	}
}
