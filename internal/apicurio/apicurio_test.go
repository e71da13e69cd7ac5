package apicurio

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
)

func TestNewURLs(t *testing.T) {
	for _, tc := range []struct{ url, base, err string }{
		{url: "http://reg:8080", base: "http://reg:8080/apis/registry/v2"},
		{url: "http://reg:8080/", base: "http://reg:8080/apis/registry/v2"},
		{url: "https://reg/prefix", base: "https://reg/prefix/apis/registry/v2"},
		{url: "http://reg:8080/apis/registry/v2", base: "http://reg:8080/apis/registry/v2"},
		{url: "http://reg:8080/apis/registry/v3/", base: "http://reg:8080/apis/registry/v3"},
		{url: "http://reg:8080/apis/ccompat/v7", err: "kind confluent"},
		{url: "http://reg:8080/apis/registry/v1", err: "v2 or …/v3"},
		{url: "reg:8080", err: "not a URL"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			c, err := New(tc.url, Options{})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil || c.Base() != tc.base {
				t.Fatalf("got %v, %v; want base %s", c, err, tc.base)
			}
		})
	}
}

// TestAnswers: what the client makes of the registry's answers. A page
// answered with 200 (a UI serving every path, a proxy's login page) is not
// a schema: an error that makes records wait, never a schema error that
// would dead-letter them; a 404 from a path that is not Apicurio's API is
// such an error too, and from the API it means the id is unknown.
func TestAnswers(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/api/apis/registry/v2/system/info", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"version":"2.4.2.Final"}`))
	})
	mux.HandleFunc("/api/apis/registry/v2/ids/globalIds/1", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(` {"type":"record","name":"Key","fields":[{"name":"id","type":"int"}]}`))
	})
	mux.HandleFunc("/api/apis/registry/v2/ids/contentIds/1", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write([]byte(`"string"`))
	})
	mux.HandleFunc("/ui/apis/registry/v2/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><title>Sign in</title>`))
	})
	mux.HandleFunc("/api/apis/registry/v2/ids/globalIds/2", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"message":"No artifact with ID '2' in group 'null' was found.","error_code":404}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx := context.Background()
	api, _ := New(srv.URL+"/api", Options{})
	if s, err := api.SchemaByGlobalID(ctx, 1); err != nil || !strings.Contains(s.Schema, `"name":"Key"`) || s.Type != sr.TypeAvro {
		t.Errorf("global id 1: %+v, %v", s, err)
	}
	if s, err := api.SchemaByID(ctx, 1); err != nil || s.Schema != `"string"` {
		t.Errorf("content id 1: %+v, %v", s, err)
	}
	var re *sr.ResponseError
	if _, err := api.SchemaByGlobalID(ctx, 2); !errors.As(err, &re) || re.StatusCode != http.StatusNotFound || !strings.Contains(err.Error(), "No artifact") {
		t.Errorf("unknown global id: %v, want a 404 response error", err)
	}
	ui, _ := New(srv.URL+"/ui", Options{})
	if _, err := ui.SchemaByGlobalID(ctx, 1); err == nil || errors.As(err, &re) || !strings.Contains(err.Error(), "not a schema") {
		t.Errorf("an HTML page: %v, want an error that is not a response error", err)
	}
	wrong, _ := New(srv.URL+"/nope", Options{})
	if _, err := wrong.SchemaByGlobalID(ctx, 2); err == nil || errors.As(err, &re) || !strings.Contains(err.Error(), "check schema_registry.url") {
		t.Errorf("a wrong path: %v, want an error that is not a 404", err)
	}
}
