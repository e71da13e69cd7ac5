package apicurio

import (
	"strings"
	"testing"
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
