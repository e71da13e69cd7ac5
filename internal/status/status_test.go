package status

import (
	"strings"
	"testing"
	"time"
)

func TestSeriesKeepsFifteenMinutes(t *testing.T) {
	var s series
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	for i := 0; i <= 200; i++ { // 200 samples 10 s apart: 33 minutes
		s.add(point{at: t0.Add(time.Duration(i) * 10 * time.Second), applied: int64(i * 50), lag: int64(i % 7)})
	}
	if first, last := s.points[0].at, s.points[len(s.points)-1].at; last.Sub(first) > ChartSpan || len(s.points) != 91 {
		t.Fatalf("kept %d points over %s, want 91 over at most %s", len(s.points), last.Sub(first), ChartSpan)
	}
	c := s.chart()
	if len(c.rate) != 90 || c.rate[0] != 5 {
		t.Fatalf("rates %v: want 90 rates of 5 events/s", c.rate)
	}
}

func TestSVG(t *testing.T) {
	now := time.Date(2026, 12, 7, 10, 15, 0, 0, time.UTC)
	cases := []struct {
		name   string
		at     []time.Time
		values []float64
		want   []string
	}{
		{"empty", nil, nil, []string{"no samples yet"}},
		{"flat zero", []time.Time{now.Add(-time.Minute), now}, []float64{0, 0}, []string{"<polyline", "0 events/s (peak 0)"}},
		{"peak", []time.Time{now.Add(-2 * time.Minute), now.Add(-time.Minute), now}, []float64{12000, 3.25, 40}, []string{"40 events/s (peak 12k)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := string(svg("applied", "events/s", c.at, c.values, now))
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("%s lacks %q", got, w)
				}
			}
			if strings.Contains(got, "NaN") || strings.Contains(got, "Inf") {
				t.Errorf("%s", got)
			}
		})
	}
}

func TestQuoteArg(t *testing.T) {
	for in, want := range map[string]string{
		"orders_history":        "orders_history",
		"/etc/scd2sink/x.yaml":  "/etc/scd2sink/x.yaml",
		"my config.yaml":        "'my config.yaml'",
		"it's":                  `'it'\''s'`,
		"":                      "''",
		"$(rm -rf /)":           "'$(rm -rf /)'",
		"Orders-2026.history.v": "Orders-2026.history.v",
	} {
		if got := quoteArg(in); got != want {
			t.Errorf("quoteArg(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestSeconds(t *testing.T) {
	for in, want := range map[float64]string{0.42: "0.4 s", 12: "12 s", 200: "3m20s", 7500: "2h5m0s", 3 * 86400: "3 days"} {
		if got := seconds(in); got != want {
			t.Errorf("seconds(%v) = %s, want %s", in, got, want)
		}
	}
}
