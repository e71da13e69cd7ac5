package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README is a front door: at most 200 lines, linking every page of the
// manual in docs/; every page starts by saying what it answers, and its
// links to other pages name pages that exist.
func TestReadmeAndManual(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 200 {
		t.Errorf("README.md has %d lines, want at most 200", n)
	}
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil || len(pages) < 8 {
		t.Fatalf("docs pages: %v %v", pages, err)
	}
	link := regexp.MustCompile(`\]\(([a-z0-9-]+\.md)(#[a-z0-9-]+)?\)`)
	for _, p := range pages {
		name := filepath.Base(p)
		if !strings.Contains(string(readme), "](docs/"+name) {
			t.Errorf("README.md does not link docs/%s", name)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if head := strings.SplitN(string(b), "\n\n", 3); len(head) < 2 || !strings.HasPrefix(head[0], "# ") ||
			!(strings.Contains(head[1], "answers") || strings.Contains(head[1], "measured")) {
			t.Errorf("docs/%s does not start with a title and what it answers", name)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			if _, err := os.Stat(filepath.Join("../docs", m[1])); err != nil {
				t.Errorf("docs/%s links %s, which does not exist", name, m[1])
			}
		}
	}
}
