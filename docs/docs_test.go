package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The manual stands alone: a user has the repository and nothing beside it.
// TestDocsLinks reads every page a user reads (README.md, CHANGELOG.md,
// docs/*.md, everything under deploy/ but Go files, and the comments of
// Dockerfile and docker-compose.yml) and checks, page by page:
//
//   - every relative markdown link [x](path#anchor) names a file that
//     exists (relative to the page), and an #anchor names a heading of the
//     target page, by GitHub's rules for heading anchors;
//   - every mention of a page by its path from the repository's root
//     (docs/x.md, README.md, CHANGELOG.md), as comments and prose name
//     them, names a page that exists;
//   - no page points outside the repository (the design notes, the
//     real-stack notes and the field notes the project was built from, or
//     a folder beside the repository);
//   - no user page (all but docs/development.md and docs/benchmark-log.md,
//     which are the developers' and the measurements' own) names a Go test,
//     benchmark or fuzz target (in code too: `-bench Pipeline` selects a
//     benchmark without naming it), an issue number, a commit hash or the
//     machine the tests ran on (outside code).
func TestDocsLinks(t *testing.T) {
	for _, p := range pages(t) {
		t.Run(p, func(t *testing.T) {
			raw, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			text := string(raw)
			if !strings.HasSuffix(p, ".md") {
				text = comments(p, text)
			}
			for _, bad := range outside.FindAllString(text, -1) {
				t.Errorf("points outside the repository: %q", bad)
			}
			for _, m := range mentioned.FindAllStringSubmatch(text, -1) {
				if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
					t.Errorf("mentions %s, which does not exist", m[1])
				}
			}
			if userPage(p) {
				prose := text
				if strings.HasSuffix(p, ".md") {
					prose = stripCode(text)
				}
				for _, f := range forbidden {
					for _, bad := range f.re.FindAllString(f.in(text, prose), -1) {
						t.Errorf("names %s: %q", f.what, bad)
					}
				}
				for _, w := range hexWord.FindAllString(prose, -1) {
					if strings.ContainsAny(w, "0123456789") && strings.ContainsAny(w, "abcdef") {
						t.Errorf("names a commit hash: %q", w)
					}
				}
			}
			if strings.HasSuffix(p, ".md") {
				checkLinks(t, p, text)
			}
		})
	}
}

// pages lists what a user reads, relative to this directory.
func pages(t *testing.T) []string {
	t.Helper()
	out := []string{"../README.md", "../CHANGELOG.md", "../Dockerfile", "../docker-compose.yml"}
	docs, err := filepath.Glob("*.md")
	if err != nil || len(docs) < 12 {
		t.Fatalf("docs/*.md: %v %v", docs, err)
	}
	out = append(out, docs...)
	err = filepath.WalkDir("../deploy", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(p, ".go") {
			return err
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// userPage: every page but the developers' and the measurement log.
func userPage(p string) bool {
	return p != "development.md" && p != "benchmark-log.md"
}

var (
	outside   = regexp.MustCompile(`\bDESIGN\b|REAL_STACK|FIELD_NOTES|\.\./shared|shared folder`)
	mentioned = regexp.MustCompile(`(?:^|[^\w./-])((?:docs/[\w-]+|README|CHANGELOG)\.md)\b`)
	hexWord   = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
	forbidden = []struct {
		what string
		re   *regexp.Regexp
		in   func(all, prose string) string
	}{
		// Test names count in code too: a command naming a test is a
		// developer's command.
		{"a Go test", regexp.MustCompile(`\b(?:Test[A-Z][A-Za-z]+|Benchmark[A-Z]\w*|Fuzz[A-Z]\w*)`), wholeText},
		{"an issue", regexp.MustCompile(`(?i)\bissues? #?\d+|(?:^|[\s(])#\d+\b`), outsideCode},
		{"the test machine", regexp.MustCompile(`(?i)\bthis (?:\d+-core )?machine\b|\b\d+-core machine\b`), outsideCode},
	}
)

func wholeText(all, _ string) string     { return all }
func outsideCode(_, prose string) string { return prose }

// comments returns the comment lines of a file that is not markdown:
// YAML, SQL, shell, a Dockerfile. JSON has none: all of it counts.
func comments(p, text string) string {
	if strings.HasSuffix(p, ".json") {
		return text
	}
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		for _, mark := range []string{"#", "--"} {
			if i := strings.Index(line, mark); i >= 0 && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t') {
				b.WriteString(line[i:])
				b.WriteByte('\n')
				break
			}
		}
	}
	return b.String()
}

var (
	fence      = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```[^\\n]*$")
	inlineCode = regexp.MustCompile("`[^`\\n]*`")
	link       = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)\)`)
	heading    = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t#]*$`)
	mdLink     = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// stripCode blanks fenced code blocks and inline code spans.
func stripCode(md string) string {
	md = fence.ReplaceAllStringFunc(md, func(s string) string { return strings.Repeat("\n", strings.Count(s, "\n")) })
	return inlineCode.ReplaceAllString(md, "``")
}

// checkLinks checks the relative links of page p.
func checkLinks(t *testing.T, p, md string) {
	t.Helper()
	for _, m := range link.FindAllStringSubmatch(stripCode(md), -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		path, anchor, _ := strings.Cut(target, "#")
		file := p
		if path != "" {
			file = filepath.Join(filepath.Dir(p), path)
			if _, err := os.Stat(file); err != nil {
				t.Errorf("links %s, which does not exist", target)
				continue
			}
		}
		if anchor == "" {
			continue
		}
		if !strings.HasSuffix(file, ".md") {
			t.Errorf("links %s: an anchor in a file that is not markdown", target)
			continue
		}
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if as := anchors(string(raw)); !slices.Contains(as, anchor) {
			t.Errorf("links %s: no heading of %s has the anchor %q", target, filepath.Base(file), anchor)
		}
	}
}

// anchors returns the anchors GitHub gives the headings of a markdown
// page, in order: the heading's text, lowercased, without punctuation but
// hyphens and underscores, spaces made hyphens; a repeated one gets -1,
// -2 and so on.
func anchors(md string) []string {
	var out []string
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(stripFences(md), -1) {
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			seen[s]++
			s += "-" + strconv.Itoa(n)
		} else {
			seen[s] = 1
		}
		out = append(out, s)
	}
	return out
}

// stripFences blanks fenced code blocks (a "# comment" in one is no heading).
func stripFences(md string) string {
	return fence.ReplaceAllStringFunc(md, func(s string) string { return strings.Repeat("\n", strings.Count(s, "\n")) })
}

// slug is a heading's anchor by GitHub's rules.
func slug(h string) string {
	h = mdLink.ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// The slug rules, on headings of this manual's kind.
func TestDocsSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Deletes as rows":                             "deletes-as-rows",
		"Import: years of history kept elsewhere":     "import-years-of-history-kept-elsewhere",
		"`scd_close_seq` and `scd_raw_t`":             "scd_close_seq-and-scd_raw_t",
		"Up to when is the history complete?":         "up-to-when-is-the-history-complete",
		"Kubernetes, beside Strimzi":                  "kubernetes-beside-strimzi",
		"Type 1 vs tracked (Type 2) columns":          "type-1-vs-tracked-type-2-columns",
		"See [operations](operations.md), then retry": "see-operations-then-retry",
		"A -> B": "a---b",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
	if got := anchors("# A\n\n```\n# not a heading\n```\n## A\n## B ##\n## A\n"); !slices.Equal(got, []string{"a", "a-1", "b", "a-2"}) {
		t.Errorf("Anchors: %q", got)
	}
}
