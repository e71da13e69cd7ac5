// Package apicurio is a client of Apicurio Registry's own REST API, v2 or
// v3: the writer schemas that the Avro decoder needs, by global id and by
// content id (franz-go's sr client speaks the Confluent API only, which
// Apicurio serves as ccompat for content ids, never for global ids).
//
// The client is only asked on a decoder cache miss; it keeps no state
// beyond its HTTP client, and is safe for concurrent use.
package apicurio

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// Options are the client's transport and credentials.
type Options struct {
	// HTTPClient sends the requests (TLS, timeouts); nil: a client with a
	// 30 s timeout.
	HTTPClient *http.Client
	// Auth sets a request's credentials (basic auth, a bearer token);
	// nil: none.
	Auth func(*http.Request) error
}

// Client fetches schemas from an Apicurio Registry.
type Client struct {
	base  string // …/apis/registry/v2 or …/v3, no trailing slash
	opts  Options
	apiOK atomic.Bool // the base answered as Apicurio's API once
}

// maxSchema bounds a schema's size: a registry answering with something
// else entirely (a proxy's page) must not be read without end.
const maxSchema = 16 << 20

// New returns a client for the registry at rawURL: either its API's root
// as Apicurio's converters are given it (…/apis/registry/v2 or …/v3), or
// the server's root (then the v2 API, which Apicurio 2.x and 3.x serve).
func New(rawURL string, opts Options) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(rawURL, "/"))
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("%q is not a URL", rawURL)
	}
	p := u.Path
	switch {
	case strings.HasSuffix(p, "/apis/registry/v2"), strings.HasSuffix(p, "/apis/registry/v3"):
	case strings.Contains(p, "/apis/ccompat/"):
		return nil, fmt.Errorf("%s is Apicurio's Confluent-compatible API: use schema_registry.kind confluent with it, or give kind apicurio the server's root or …/apis/registry/v2", u.Path)
	case strings.Contains(p, "/apis/registry/"):
		return nil, fmt.Errorf("%s: Apicurio's API is …/apis/registry/v2 or …/v3", u.Path)
	default:
		u.Path = p + "/apis/registry/v2"
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	return &Client{base: u.String(), opts: opts}, nil
}

// Base is the API root the client asks.
func (c *Client) Base() string { return c.base }

// SchemaByID returns the schema with the given content id (what
// apicurio.registry.use-id=contentId writes, and what Apicurio's ccompat
// API calls a schema id).
func (c *Client) SchemaByID(ctx context.Context, id int) (sr.Schema, error) {
	return c.get(ctx, "contentIds", int64(id))
}

// SchemaByGlobalID returns the schema of the artifact version with the
// given global id (the 2.x converters' default).
func (c *Client) SchemaByGlobalID(ctx context.Context, id int64) (sr.Schema, error) {
	return c.get(ctx, "globalIds", id)
}

func (c *Client) get(ctx context.Context, kind string, id int64) (sr.Schema, error) {
	u := c.base + "/ids/" + kind + "/" + strconv.FormatInt(id, 10)
	s, err := c.do(ctx, u)
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound && !c.apiOK.Load() {
		// A 404 means "no such id" only from Apicurio's API: from a wrong
		// path it must not dead-letter records, it must make them wait.
		if _, ierr := c.do(ctx, c.base+"/system/info"); ierr != nil {
			return sr.Schema{}, fmt.Errorf("%s does not answer as Apicurio's API (%v): check schema_registry.url", c.base, ierr)
		}
		c.apiOK.Store(true)
	}
	return s, err
}

func (c *Client) do(ctx context.Context, u string) (sr.Schema, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return sr.Schema{}, err
	}
	req.Header.Set("Accept", "*/*")
	req.Header.Set("User-Agent", "scd2sink")
	if c.opts.Auth != nil {
		if err := c.opts.Auth(req); err != nil {
			return sr.Schema{}, err
		}
	}
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return sr.Schema{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSchema+1))
	if err != nil {
		return sr.Schema{}, fmt.Errorf("reading %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		// The same error type as franz-go's client, so that the decoder
		// tells "not known (yet)" (404) from a registry in trouble.
		re := &sr.ResponseError{Method: http.MethodGet, URL: u, StatusCode: resp.StatusCode, Raw: body}
		var e struct {
			Code    int    `json:"error_code"`
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &e) == nil {
			re.ErrorCode, re.Message = e.Code, e.Message
		}
		if re.Message == "" {
			re.Message = http.StatusText(resp.StatusCode)
		}
		re.Message = fmt.Sprintf("GET %s: %d %s", u, resp.StatusCode, re.Message)
		return sr.Schema{}, re
	}
	if len(body) > maxSchema {
		return sr.Schema{}, fmt.Errorf("%s: a schema of more than %d bytes", u, maxSchema)
	}
	// A schema is JSON (an object, a union's array or a type's name). A
	// page (a UI serving every path, a login page of a proxy) is not the
	// API: not a schema error that would dead-letter records, but a
	// registry that does not answer, so that they wait.
	if t := bytes.TrimSpace(body); strings.Contains(resp.Header.Get("Content-Type"), "text/html") ||
		len(t) == 0 || (t[0] != '{' && t[0] != '[' && t[0] != '"') {
		return sr.Schema{}, fmt.Errorf("GET %s answered %q, not a schema: check schema_registry.url", u, resp.Header.Get("Content-Type"))
	}
	c.apiOK.Store(true)
	s := sr.Schema{Schema: string(body), Type: sr.TypeAvro}
	switch strings.ToUpper(resp.Header.Get("X-Registry-ArtifactType")) {
	case "PROTOBUF":
		s.Type = sr.TypeProtobuf
	case "JSON":
		s.Type = sr.TypeJSON
	}
	return s, nil
}
