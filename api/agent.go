package api

import (
	"context"
	"net/http"
	"strings"
)

// AgentPeer is another agent as an agent knows it, and whether its kernel
// entries (neighbour, FDB, routes) are programmed here.
type AgentPeer struct {
	AgentID    string   `json:"agent_id"`
	IP         string   `json:"ip,omitempty"`
	VTEPIP     string   `json:"vtep_ip,omitempty"`
	VTEPMAC    string   `json:"vtep_mac,omitempty"`
	Subnets    []string `json:"subnets,omitempty"`
	Version    uint64   `json:"version"`
	Programmed bool     `json:"programmed"`
	// Mode is how the agent's dataplane reaches the peer: DataplaneVXLAN
	// or DataplaneRouted (empty for a peer reached through WireGuard or
	// not programmed).
	Mode string `json:"mode,omitempty"`
}

// AgentPeers is GET /overlay-agent/peers: the membership an agent holds,
// merged from the masters' state and from gossip.
type AgentPeers struct {
	Self string `json:"self"`
	// MasterIndex is the index of the last master state this agent read.
	MasterIndex uint64 `json:"master_index"`
	// ClusterID is the masters' cluster this agent belongs to (State.ClusterID);
	// empty until a master that serves one answered.
	ClusterID string `json:"cluster_id,omitempty"`
	// MastersReachable tells whether the last watch of the masters succeeded.
	MastersReachable bool `json:"masters_reachable"`
	// FastPath is the state of the eBPF fast path of the agent's routed
	// peers, as its last reconcile left it: "on", "off" (--fast-path=false,
	// or no peer routed yet) or "unavailable: " and why; empty when routed
	// mode is off.
	FastPath   string      `json:"fast_path,omitempty"`
	Peers      []AgentPeer `json:"peers"`
	Tombstones []Tombstone `json:"tombstones,omitempty"`
}

// AgentClient reads an agent's HTTP API.
type AgentClient struct {
	base string
	http *http.Client
}

// NewAgentClient returns a client for the agent at base ("http://HOST:PORT").
func NewAgentClient(base string, hc *http.Client) *AgentClient {
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	return &AgentClient{base: strings.TrimRight(base, "/"), http: hc}
}

// Overlay returns the agent's record with each overlay's status.
func (c *AgentClient) Overlay(ctx context.Context) (*AgentInfo, error) {
	var out AgentInfo
	return &out, c.get(ctx, "/overlay-agent/overlay", &out)
}

// Peers returns the agent's membership view.
func (c *AgentClient) Peers(ctx context.Context) (*AgentPeers, error) {
	var out AgentPeers
	return &out, c.get(ctx, "/overlay-agent/peers", &out)
}

// Docker reads the agent's Docker plugin status (GET /overlay-agent/docker)
// into out, the agent's dockeripam.Status (api imports no agent package).
// An agent whose plugin is off answers CodeNotFound.
func (c *AgentClient) Docker(ctx context.Context, out any) error {
	return c.get(ctx, "/overlay-agent/docker", out)
}

// get reads path into out through Call, the tree's one JSON client: an
// error answer is an *Error with the agent's message and code, an agent
// that cannot be reached an *Error wrapping ErrUnreachable.
func (c *AgentClient) get(ctx context.Context, path string, out any) error {
	return Call(ctx, c.http, http.MethodGet, c.base+path, nil, out, nil)
}
