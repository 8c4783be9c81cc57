package dockeripam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
)

// The Docker Engine API, the few calls carve needs, over the engine's unix
// socket with api.Call (no Docker client module).

// maxAPIVersion is the newest Engine API version this client speaks; an
// older engine is spoken to in its own version, like Docker's client
// negotiates.
const maxAPIVersion = "1.47"

// minAPIVersion is the oldest: network IPAM options and event filters.
const minAPIVersion = "1.25"

// errNotFound is the engine's 404.
var errNotFound = errors.New("not found")

// engineClient talks to one Docker engine.
type engineClient struct {
	host    string // as given, for messages
	sock    string
	http    *http.Client // no overall timeout: the event stream is long
	version string       // negotiated, e.g. "1.41"; empty before ping
}

// newEngineClient accepts unix:///path (or a bare absolute path).
func newEngineClient(host string) (*engineClient, error) {
	sock, ok := strings.CutPrefix(host, "unix://")
	if !ok {
		if !strings.HasPrefix(host, "/") {
			return nil, fmt.Errorf("docker host %q: want unix:///path/to/docker.sock", host)
		}
		sock = host
	}
	if sock == "" {
		return nil, fmt.Errorf("docker host %q: empty socket path", host)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		MaxIdleConns:    2,
		IdleConnTimeout: 30 * time.Second,
	}
	return &engineClient{host: host, sock: sock, http: &http.Client{Transport: tr}}, nil
}

// close drops the client's idle connections (a session's client is not reused).
func (c *engineClient) close() { c.http.CloseIdleConnections() }

// engineError is an engine answer with a non-2xx status (api.Call's
// *api.Error, which it wraps); a 404 is errNotFound.
type engineError struct{ answer *api.Error }

func (e *engineError) Error() string {
	return fmt.Sprintf("engine: %s (HTTP %d)", e.answer.Message, e.answer.Status)
}

func (e *engineError) Unwrap() error { return e.answer }

func (e *engineError) Is(target error) bool {
	return target == errNotFound && e.answer.Status == http.StatusNotFound
}

// url is the call's URL, below the negotiated version prefix.
func (c *engineClient) url(path string) string {
	if c.version != "" {
		return "http://docker/v" + c.version + path
	}
	return "http://docker" + path
}

// do sends a call (api.Call); a nil out discards the answer, hdr (when not
// nil) receives its headers.
func (c *engineClient) do(ctx context.Context, method, path string, in, out any, hdr *http.Header) error {
	return c.engineErr(api.Call(ctx, c.http, method, c.url(path), in, out, hdr))
}

// engineErr names the engine in a failure to reach it, and wraps its answers.
func (c *engineClient) engineErr(err error) error {
	var ae *api.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, api.ErrUnreachable):
		return fmt.Errorf("no Docker engine at %s: %w", c.host, err)
	case errors.As(err, &ae) && ae.Status != 0:
		return &engineError{answer: ae}
	}
	return fmt.Errorf("engine: %w", err)
}

// engineVersion is what GET /version says.
type engineVersion struct {
	Version       string
	APIVersion    string `json:"ApiVersion"`
	MinAPIVersion string `json:"MinAPIVersion"`
}

// connect pings the engine and settles the API version.
func (c *engineClient) connect(ctx context.Context) (engineVersion, error) {
	c.version = ""
	var hdr http.Header
	if err := c.do(ctx, http.MethodGet, "/_ping", nil, nil, &hdr); err != nil {
		return engineVersion{}, err
	}
	server := hdr.Get("API-Version")
	if server != "" {
		if err := c.settle(server); err != nil {
			return engineVersion{}, err
		}
	}
	var v engineVersion
	if err := c.do(ctx, http.MethodGet, "/version", nil, &v, nil); err != nil {
		return engineVersion{}, err
	}
	if server == "" {
		// An engine too old to say it in its ping: /version (unversioned) does.
		if v.APIVersion == "" {
			return v, fmt.Errorf("the Docker engine at %s did not tell its API version", c.host)
		}
		if err := c.settle(v.APIVersion); err != nil {
			return v, err
		}
	}
	return v, nil
}

// settle picks the API version to speak with an engine that speaks server.
func (c *engineClient) settle(server string) error {
	switch {
	case versionLess(server, minAPIVersion):
		return fmt.Errorf("the Docker engine at %s speaks API %s; carve needs %s or newer", c.host, server, minAPIVersion)
	case versionLess(maxAPIVersion, server):
		c.version = maxAPIVersion
	default:
		c.version = server
	}
	return nil
}

// versionLess compares "major.minor" API versions.
func versionLess(a, b string) bool {
	pa, pb := strings.SplitN(a, ".", 2), strings.SplitN(b, ".", 2)
	for i := range 2 {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// dockerNetwork is the subset of a network resource carve reads and writes.
type dockerNetwork struct {
	Name       string `json:"Name"`
	ID         string `json:"Id,omitempty"`
	Driver     string `json:"Driver"`
	EnableIPv6 bool   `json:"EnableIPv6"`
	IPAM       struct {
		Driver  string            `json:"Driver"`
		Config  []ipamConfig      `json:"Config"`
		Options map[string]string `json:"Options"`
	} `json:"IPAM"`
	Options    map[string]string           `json:"Options"`
	Labels     map[string]string           `json:"Labels,omitempty"`
	Containers map[string]networkContainer `json:"Containers,omitempty"`
}

type ipamConfig struct {
	Subnet  string `json:"Subnet,omitempty"`
	Gateway string `json:"Gateway,omitempty"`
	IPRange string `json:"IPRange,omitempty"`
}

// networkContainer is an endpoint in GET /networks/{id}.
type networkContainer struct {
	Name        string `json:"Name"`
	EndpointID  string `json:"EndpointID"`
	MacAddress  string `json:"MacAddress"`
	IPv4Address string `json:"IPv4Address"`
	IPv6Address string `json:"IPv6Address"`
}

// createNetworkRequest is POST /networks/create.
type createNetworkRequest struct {
	dockerNetwork
	CheckDuplicate bool `json:"CheckDuplicate"`
}

func (c *engineClient) inspectNetwork(ctx context.Context, nameOrID string) (*dockerNetwork, error) {
	var n dockerNetwork
	if err := c.do(ctx, http.MethodGet, "/networks/"+url.PathEscape(nameOrID), nil, &n, nil); err != nil {
		return nil, err
	}
	return &n, nil
}

func (c *engineClient) listNetworks(ctx context.Context) ([]dockerNetwork, error) {
	var out []dockerNetwork
	return out, c.do(ctx, http.MethodGet, "/networks", nil, &out, nil)
}

func (c *engineClient) createNetwork(ctx context.Context, n dockerNetwork) (string, error) {
	var out struct {
		ID      string `json:"Id"`
		Warning string `json:"Warning"`
	}
	if err := c.do(ctx, http.MethodPost, "/networks/create", createNetworkRequest{dockerNetwork: n, CheckDuplicate: true}, &out, nil); err != nil {
		return "", err
	}
	return out.ID, nil
}

// removeNetwork deletes a network; the engine refuses while endpoints use it.
func (c *engineClient) removeNetwork(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/networks/"+url.PathEscape(id), nil, nil, nil)
}

// event is one message of GET /events.
type event struct {
	Type   string `json:"Type"`
	Action string `json:"Action"`
	Actor  struct {
		ID         string            `json:"ID"`
		Attributes map[string]string `json:"Attributes"`
	} `json:"Actor"`
}

// events streams the engine's container destroy and network connect and
// disconnect events to fn until ctx ends or the stream breaks (a connect
// is when an endpoint exists: its container is then recorded as its
// address's owner). A stream is no single
// JSON answer, so this one call opens its request itself.
func (c *engineClient) events(ctx context.Context, fn func(event)) error {
	filters, _ := json.Marshal(map[string][]string{
		"type":  {"container", "network"},
		"event": {"destroy", "connect", "disconnect"},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url("/events?filters="+url.QueryEscape(string(filters))), nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("no Docker engine at %s: %w", c.host, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var m struct{ Message string }
		if json.Unmarshal(data, &m) != nil || m.Message == "" {
			m.Message = strings.TrimSpace(string(data))
		}
		return &engineError{answer: &api.Error{Status: resp.StatusCode, Code: api.CodeInternal, Message: m.Message}}
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev event
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("event stream of %s ended: %w", c.host, err)
		}
		fn(ev)
	}
}
