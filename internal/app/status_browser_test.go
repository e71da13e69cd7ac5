package app

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromium is the headless browser of the page tests: $CHROMIUM, else
// Debian's chromium. Missing, the test fails where
// SCD2SINK_REQUIRE_BROWSER is set (.ci/run installs Chromium and sets it)
// and is skipped elsewhere.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("SCD2SINK_REQUIRE_BROWSER") != "" {
		t.Fatal("no chromium (SCD2SINK_REQUIRE_BROWSER is set): apt-get install chromium, or set CHROMIUM")
	}
	t.Skip("no chromium (apt-get install chromium, or set CHROMIUM)")
	return ""
}

// browseStatus opens the status page at url in headless Chromium and
// checks what a person sees there: the parked row with its reason, the
// dead-letter count and the command that replays them. A screenshot is
// kept in $SCD2SINK_TEST_OUTPUT (default: scd2sink-test-output-<uid> in
// the system's temp directory).
func browseStatus(t *testing.T, url string) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	// JavaScript is off for the page itself (its CSP allows no script):
	// what is read here is what a reader without scripts sees.
	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`#targets`))); err != nil {
		t.Fatalf("opening the status page in Chromium: %v", err)
	}
	read := func(sel string) string {
		t.Helper()
		text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("reading %s in Chromium: %v", sel, err)
		}
		return text
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	parked, customers := read(`tr[data-target="orders_history"]`), read(`tr[data-target="customers_history"]`)
	attention := read(`#attention`)
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("taking a screenshot: %v", err)
	}
	dir := os.Getenv("SCD2SINK_TEST_OUTPUT")
	if dir == "" {
		// Per user: a run as another user (.ci/only-go) cannot overwrite it.
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("scd2sink-test-output-%d", os.Getuid()))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("keeping the screenshot: %v", err)
	}
	path := filepath.Join(dir, "scd2sink-status-page.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Errorf("keeping the screenshot: %v", err)
	} else {
		t.Logf("screenshot of the status page: %s", path)
	}
	for _, c := range []struct{ what, text, want string }{
		{"title", title, "need attention"},
		{"orders_history's row", parked, "parked"},
		{"orders_history's row", parked, "lock timeout"},
		{"customers_history's row", customers, "1 decode"},
		{"customers_history's row", customers, "scd2sink dead-letters replay --config /etc/scd2sink/scd2sink.yaml --table customers_history"},
		{"the attention line", attention, "2 of 2 tables need attention"},
	} {
		if !strings.Contains(strings.Join(strings.Fields(c.text), " "), c.want) {
			t.Errorf("%s in Chromium: %q lacks %q", c.what, c.text, c.want)
		}
	}
	if strings.Contains(parked+customers, statusMarker) {
		t.Errorf("the rendered page shows the dead letter's value")
	}
}
