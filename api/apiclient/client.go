// Package apiclient is the Go client of the masters' HTTP API: a Client
// holds the masters' URLs and tries them in turn (failover across masters,
// the request ids a retry keeps), and opens the changes stream. It speaks
// the wire contract of package api and adds nothing to it; api never
// imports it, as the masters serve that contract without a client.
package apiclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/carve-net/carve/api"
)

// ErrNoMasters is returned by NewClient when no master URL is given.
var ErrNoMasters = errors.New("no master URL given")

// Client talks to any of a set of masters. A call tries the master that
// answered last, then the others in order, moving on when one cannot be
// reached or has no leader (503); an answer with a definite error (4xx)
// ends the call. Safe for concurrent use.
type Client struct {
	masters   []string
	http      *http.Client
	preferred atomic.Int32
}

// NewClient returns a client for the given master base URLs
// (e.g. "https://198.18.0.1:8080"; without a scheme, http://). A nil
// httpClient means a default one. Masters that serve TLS need NewClientWith
// and the cluster CA.
func NewClient(masters []string, httpClient *http.Client) (*Client, error) {
	return NewClientWith(masters, ClientOptions{HTTPClient: httpClient})
}

// ClientOptions configure NewClientWith.
type ClientOptions struct {
	// TLS verifies the masters' certificates (RootCAs: the cluster CA) and
	// presents this client's certificate (pki.Files.ClientConfig). With TLS,
	// a master URL without a scheme is https://, and http:// is refused.
	TLS *tls.Config
	// HTTPClient, if set, makes the calls (its Timeout applies). With TLS,
	// its transport must be nil or an *http.Transport, which is cloned with
	// TLS set.
	HTTPClient *http.Client
}

// NewClientWith returns a client for the given master base URLs.
func NewClientWith(masters []string, opts ClientOptions) (*Client, error) {
	scheme := "http://"
	if opts.TLS != nil {
		scheme = "https://"
	}
	var clean []string
	for _, m := range masters {
		m = strings.TrimSpace(m)
		if m == "" {
			continue
		}
		if !strings.Contains(m, "://") {
			m = scheme + m
		}
		u, err := url.Parse(m)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("invalid master URL %q: want %sHOST:PORT", m, scheme)
		}
		if opts.TLS != nil && u.Scheme != "https" {
			return nil, fmt.Errorf("master URL %q: TLS is configured (--ca-file), so the URL must be https://", m)
		}
		clean = append(clean, strings.TrimRight(u.String(), "/"))
	}
	if len(clean) == 0 {
		return nil, ErrNoMasters
	}
	hc := opts.HTTPClient
	switch {
	case hc == nil:
		hc = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second,
			TLSClientConfig:     opts.TLS,
		}}
	case opts.TLS != nil:
		var t *http.Transport
		switch tr := hc.Transport.(type) {
		case nil:
			t = http.DefaultTransport.(*http.Transport).Clone()
		case *http.Transport:
			t = tr.Clone()
		default:
			return nil, fmt.Errorf("api client: TLS needs an *http.Transport, the HTTP client has a %T", hc.Transport)
		}
		t.TLSClientConfig = opts.TLS
		c := *hc
		c.Transport = t
		hc = &c
	}
	return &Client{masters: clean, http: hc}, nil
}

// Masters returns the master base URLs.
func (c *Client) Masters() []string { return append([]string(nil), c.masters...) }

// Register registers (or re-registers) an agent and returns its leases.
// A RequestID is generated when empty and kept across the failover retries
// of this call, so the registration has one effect.
func (c *Client) Register(ctx context.Context, req api.RegisterRequest) (*api.AgentInfo, error) {
	if req.RequestID == "" {
		req.RequestID = api.NewRequestID()
	}
	var out api.AgentInfo
	if err := c.do(ctx, http.MethodPost, "/overlay-master/agents", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Report sends an agent's configuration result per overlay and returns
// its record as the masters now show it. A RequestID is generated when
// empty and kept across the failover retries of this call.
func (c *Client) Report(ctx context.Context, agentID string, req api.ReportRequest) (*api.AgentInfo, error) {
	if req.RequestID == "" {
		req.RequestID = api.NewRequestID()
	}
	var out api.AgentInfo
	if err := c.do(ctx, http.MethodPut, "/overlay-master/agents/"+url.PathEscape(agentID)+"/report", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Agent returns one agent's record.
func (c *Client) Agent(ctx context.Context, id string) (*api.AgentInfo, error) {
	var out api.AgentInfo
	if err := c.do(ctx, http.MethodGet, "/overlay-master/agents/"+url.PathEscape(id), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteAgent removes an agent and frees its leases.
func (c *Client) DeleteAgent(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/overlay-master/agents/"+url.PathEscape(id), nil, nil)
}

// DeleteAgents removes agents named by id or underlay IP (DC/OS bulk form)
// and returns the new state.
func (c *Client) DeleteAgents(ctx context.Context, agents []string) (*api.State, error) {
	return c.DeleteAgentsRequest(ctx, api.DeleteAgentsRequest{Agents: agents})
}

// DeleteAgentsRequest sends a bulk delete and returns the new state. A
// RequestID is generated when empty; giving the one of an earlier attempt
// whose outcome is unknown makes the retry have one effect.
func (c *Client) DeleteAgentsRequest(ctx context.Context, req api.DeleteAgentsRequest) (*api.State, error) {
	if req.RequestID == "" {
		req.RequestID = api.NewRequestID()
	}
	var out api.State
	if err := c.do(ctx, http.MethodPost, "/overlay-master/agents/delete", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Grow asks the masters for one more block for a bridge of an overlay and
// returns the agent's record with it (409 exhausted when the overlay has no
// free block of that size). A RequestID is generated when empty and kept
// across the failover retries of this call.
func (c *Client) Grow(ctx context.Context, agentID string, req api.GrowRequest) (*api.AgentInfo, error) {
	if req.RequestID == "" {
		req.RequestID = api.NewRequestID()
	}
	var out api.AgentInfo
	if err := c.do(ctx, http.MethodPost, "/overlay-master/agents/"+url.PathEscape(agentID)+"/blocks", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReturnBlock gives back what the agent holds inside req.Prefix and returns
// its record without it.
func (c *Client) ReturnBlock(ctx context.Context, agentID string, req api.ReturnRequest) (*api.AgentInfo, error) {
	if req.RequestID == "" {
		req.RequestID = api.NewRequestID()
	}
	var out api.AgentInfo
	if err := c.do(ctx, http.MethodPost, "/overlay-master/agents/"+url.PathEscape(agentID)+"/blocks/return", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReportGrant tells the masters of a ring grant; reporter is the donor or
// the recipient (the agent whose certificate makes the call). It returns
// the recipient's record. Idempotent.
func (c *Client) ReportGrant(ctx context.Context, reporter string, req api.GrantReport) (*api.AgentInfo, error) {
	if req.RequestID == "" {
		req.RequestID = api.NewRequestID()
	}
	var out api.AgentInfo
	if err := c.do(ctx, http.MethodPost, "/overlay-master/agents/"+url.PathEscape(reporter)+"/blocks/grants", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReportUsage sends the used and free counts of an agent's blocks (and,
// with StateIndex set, acknowledges its holdings).
func (c *Client) ReportUsage(ctx context.Context, agentID string, req api.UsageReport) (*api.UsageAnswer, error) {
	var out api.UsageAnswer
	if err := c.do(ctx, http.MethodPut, "/overlay-master/agents/"+url.PathEscape(agentID)+"/usage", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// StateOptions select the kind of state read.
type StateOptions struct {
	// Consistent asks for a linearizable read (served through the leader).
	Consistent bool
	// Index and Wait make a blocking query: the answer comes when the state's
	// index exceeds Index, or after Wait with the unchanged state.
	Index uint64
	Wait  time.Duration
}

// State reads the masters' state.
func (c *Client) State(ctx context.Context, opts StateOptions) (*api.State, error) {
	q := url.Values{}
	if opts.Consistent {
		q.Set("consistent", "true")
	}
	if opts.Wait > 0 {
		q.Set("index", strconv.FormatUint(opts.Index, 10))
		q.Set("wait", opts.Wait.String())
	}
	path := "/overlay-master/state"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out api.State
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Changes waits up to wait for the state's index to pass since and returns
// what changed after since (GET /overlay-master/changes). When since is
// older than the masters keep, the error is an *api.Error with Code api.CodeGone
// (HTTP 410) and Oldest set: read the whole State once, then watch changes
// since its index. A wait of 0 answers at once.
func (c *Client) Changes(ctx context.Context, since uint64, wait time.Duration) (*api.Changes, error) {
	q := url.Values{}
	q.Set("since", strconv.FormatUint(since, 10))
	q.Set("wait", wait.String())
	var out api.Changes
	if err := c.do(ctx, http.MethodGet, "/overlay-master/changes?"+q.Encode(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ClusterStatus returns the Raft status as the first reachable master sees it.
func (c *Client) ClusterStatus(ctx context.Context) (*api.ClusterStatus, error) {
	var out api.ClusterStatus
	if err := c.do(ctx, http.MethodGet, "/cluster/status", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Join adds a master to the Raft cluster as a voter (idempotent).
func (c *Client) Join(ctx context.Context, req api.JoinRequest) error {
	return c.do(ctx, http.MethodPost, "/cluster/join", req, nil)
}

// RemoveServer removes a master from the Raft cluster (idempotent).
func (c *Client) RemoveServer(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/cluster/servers/"+url.PathEscape(id), nil, nil)
}

// do sends the request to the masters in turn, starting with the preferred one.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	start := int(c.preferred.Load())
	var failed []masterError
	for i := range c.masters {
		idx := (start + i) % len(c.masters)
		err := c.once(ctx, c.masters[idx], method, path, in, out)
		if err == nil {
			c.preferred.Store(int32(idx))
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w", method, path, ctx.Err())
		}
		if !api.IsRetryable(err) {
			c.preferred.Store(int32(idx))
			return err
		}
		failed = append(failed, masterError{url: c.masters[idx], err: err})
	}
	return everyMasterFailed(failed)
}

// masterError is one master's failure of a call.
type masterError struct {
	url string
	err error
}

// everyMasterFailed is the error of a call that every master failed: the
// failure of a master that answered (a 503 without quorum, say) rather
// than one that could not be reached, with every master's failure in its
// message, so that an answer does not hide behind a refused connection.
func everyMasterFailed(failed []masterError) error {
	if len(failed) == 1 {
		return failed[0].err
	}
	best := len(failed) - 1
	for i, f := range failed {
		var e *api.Error
		if errors.As(f.err, &e) && e.Status != 0 {
			best = i
			break
		}
	}
	var e *api.Error
	if !errors.As(failed[best].err, &e) {
		return failed[best].err
	}
	out := *e
	if !strings.Contains(out.Message, failed[best].url) {
		out.Message = failed[best].url + ": " + out.Message
	}
	out.Also = nil
	for i, f := range failed {
		if i != best {
			out.Also = append(out.Also, describeFailure(f))
		}
	}
	return &out
}

// describeFailure names the master of a failure when its message does not.
func describeFailure(f masterError) string {
	msg := f.err.Error()
	var e *api.Error
	if errors.As(f.err, &e) {
		msg = e.Message
		if e.Status != 0 {
			msg += " (" + e.Code + ", HTTP " + strconv.Itoa(e.Status) + ")"
		}
	}
	if strings.Contains(msg, f.url) {
		return msg
	}
	return f.url + ": " + msg
}

func (c *Client) once(ctx context.Context, base, method, path string, in, out any) error {
	return api.Call(ctx, c.http, method, base+path, in, out, nil)
}
