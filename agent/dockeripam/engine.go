package dockeripam

import (
	"bytes"
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
)

// The Docker Engine API, the few calls carve needs, over the engine's unix
// socket with plain net/http (no Docker client module).

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

// apiError is an engine answer with a non-2xx status.
type apiError struct {
	Status  int
	Message string
}

func (e *apiError) Error() string { return fmt.Sprintf("engine: %s (HTTP %d)", e.Message, e.Status) }

func (e *apiError) Is(target error) bool {
	return target == errNotFound && e.Status == http.StatusNotFound
}

// do sends a call. path is below the version prefix; a nil out discards the body.
func (c *engineClient) do(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("engine: %s %s: bad answer: %w", method, path, err)
	}
	return nil
}

// send returns a 2xx response (the caller closes it) or an error.
func (c *engineClient) send(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	p := path
	if c.version != "" {
		p = "/v" + c.version + path
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://docker"+p, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("no Docker engine at %s: %w", c.host, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var m struct{ Message string }
		if json.Unmarshal(data, &m) != nil || m.Message == "" {
			m.Message = strings.TrimSpace(string(data))
		}
		return nil, &apiError{Status: resp.StatusCode, Message: m.Message}
	}
	return resp, nil
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
	resp, err := c.send(ctx, http.MethodGet, "/_ping", nil)
	if err != nil {
		return engineVersion{}, err
	}
	server := resp.Header.Get("API-Version")
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if server != "" {
		if err := c.settle(server); err != nil {
			return engineVersion{}, err
		}
	}
	var v engineVersion
	if err := c.do(ctx, http.MethodGet, "/version", nil, &v); err != nil {
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
	if err := c.do(ctx, http.MethodGet, "/networks/"+url.PathEscape(nameOrID), nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

func (c *engineClient) listNetworks(ctx context.Context) ([]dockerNetwork, error) {
	var out []dockerNetwork
	return out, c.do(ctx, http.MethodGet, "/networks", nil, &out)
}

func (c *engineClient) createNetwork(ctx context.Context, n dockerNetwork) (string, error) {
	var out struct {
		ID      string `json:"Id"`
		Warning string `json:"Warning"`
	}
	if err := c.do(ctx, http.MethodPost, "/networks/create", createNetworkRequest{dockerNetwork: n, CheckDuplicate: true}, &out); err != nil {
		return "", err
	}
	return out.ID, nil
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

// events streams the engine's container destroy and network disconnect
// events to fn until ctx ends or the stream breaks.
func (c *engineClient) events(ctx context.Context, fn func(event)) error {
	filters, _ := json.Marshal(map[string][]string{
		"type":  {"container", "network"},
		"event": {"destroy", "disconnect"},
	})
	resp, err := c.send(ctx, http.MethodGet, "/events?filters="+url.QueryEscape(string(filters)), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
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
