package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/scd2sink/scd2sink/consumer"
	"github.com/scd2sink/scd2sink/internal/status"
)

// httpServer serves /metrics, /healthz, /readyz and the status page (/
// and /status.json); nothing that changes state.
type httpServer struct {
	ln  net.Listener
	srv *http.Server
}

func newHTTP(addr string, reg *prometheus.Registry, health *consumer.Health, page *status.Server) (*httpServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http.addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	if page != nil {
		page.Register(mux)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !health.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:")
			for _, why := range health.NotReady() {
				fmt.Fprintf(w, "  %s\n", why)
			}
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return &httpServer{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}, nil
}

// run serves until ctx ends.
func (h *httpServer) run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- h.srv.Serve(h.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := h.srv.Shutdown(sctx); errors.Is(err, context.DeadlineExceeded) {
			_ = h.srv.Close() // a request still reading (a status page): cut it, a clean stop all the same
		} else if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}
