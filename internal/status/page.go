package status

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"sync"
	"time"
)

//go:embed assets/page.html assets/style.css
var assets embed.FS

var page = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"deref": func(p *int64) int64 { return *p },
}).ParseFS(assets, "assets/page.html"))

var style = func() template.CSS {
	b, err := assets.ReadFile("assets/style.css")
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	return template.CSS(b)
}()

// Refresh is how often the page reloads itself, in seconds; a report
// younger than half of it is served again rather than read anew.
const Refresh = 10

// Server serves the page and its JSON from a Collector. Nothing it serves
// changes state.
type Server struct {
	c       *Collector
	version string

	mu     sync.Mutex
	last   Report
	lastAt time.Time
}

// NewServer returns a Server of c's reports; version is shown at the foot.
func NewServer(c *Collector, version string) *Server {
	return &Server{c: c, version: version}
}

// Register adds GET / and GET /status.json to mux.
func (s *Server) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", s.servePage)
	mux.HandleFunc("GET /status.json", s.serveJSON)
}

// report is a fresh report, or the last one when it is younger than half
// a refresh (a second when it could not read everything): many open pages
// cost one read. The read outlives a client that goes away (its own
// deadlines bound it), so that its errors are never "context canceled".
func (s *Server) report(ctx context.Context) Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := Refresh * time.Second / 2
	if len(s.last.Errors) > 0 {
		keep = time.Second
	}
	if time.Since(s.lastAt) < keep {
		return s.last
	}
	s.last, s.lastAt = s.c.Collect(context.WithoutCancel(ctx)), time.Now()
	return s.last
}

func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	rep := s.report(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(rep)
}

func (s *Server) servePage(w http.ResponseWriter, r *http.Request) {
	rep := s.report(r.Context())
	var buf bytes.Buffer
	if err := page.Execute(&buf, view(rep, s.version)); err != nil {
		http.Error(w, "rendering the status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'")
	_, _ = w.Write(buf.Bytes())
}

// pageView is what the template renders.
type pageView struct {
	Report         Report
	Rows           []rowView
	Trouble        int
	TroubleTargets []string
	Attention      bool
	Generated      string
	Refresh        int
	Style          template.CSS
	Version        string
}

type rowView struct {
	Target          Target
	ParkedFor       string
	LagSeconds      string
	CompleteThrough string
	Rate, Lag       template.HTML
}

func view(rep Report, version string) pageView {
	v := pageView{Report: rep, Generated: rep.GeneratedAt.Format("2006-01-02 15:04:05Z07:00"), Refresh: Refresh, Style: style, Version: version,
		Attention: rep.NeedsAttention()}
	for _, t := range rep.Targets {
		row := rowView{Target: t,
			Rate: svg("applied", "events/s", t.chart.at, t.chart.rate, rep.GeneratedAt),
			Lag:  svg("lag", "events", t.chart.at, t.chart.lag, rep.GeneratedAt)}
		if t.ParkedSince != nil {
			row.ParkedFor = rep.GeneratedAt.Sub(*t.ParkedSince).Round(time.Second).String()
		}
		if t.LagSeconds != nil {
			row.LagSeconds = seconds(*t.LagSeconds)
		}
		if t.CompleteThrough != nil {
			row.CompleteThrough = t.CompleteThrough.Format("2006-01-02 15:04:05.000Z07:00")
		}
		if t.Trouble() {
			v.Trouble++
			v.TroubleTargets = append(v.TroubleTargets, t.Target)
		}
		v.Rows = append(v.Rows, row)
	}
	return v
}

// seconds writes a lag as people read it: 0.4 s, 12 s, 3m20s, 2h5m.
func seconds(s float64) string {
	switch {
	case s < 10:
		return fmt.Sprintf("%.1f s", s)
	case s < 60:
		return fmt.Sprintf("%.0f s", s)
	case s >= 48*3600:
		return fmt.Sprintf("%.0f days", s/86400)
	}
	return (time.Duration(s) * time.Second).Round(time.Second).String()
}
