package api

import (
	"context"
	"net/http"
	"net/url"
)

// An agent's HTTP API shows its container address service read-only, for
// operators (carve ipam show, carve ipam check): GET /overlay-agent/ipam/status
// and GET /overlay-agent/ipam/allocations, each with an optional ?network=.

// What an agent can tell of an allocation's container (AgentAllocation.Container).
const (
	// ContainerLive: the CNI runtime's cache holds the attachment, and its
	// network namespace, when the cache names one, exists.
	ContainerLive = "live"
	// ContainerGone: no CNI runtime holds the attachment any more (its cache
	// entry is gone, or names a network namespace that no longer exists):
	// the address leaked, unless an ADD is in flight.
	ContainerGone = "gone"
	// ContainerUnknown: the agent cannot tell (a Docker allocation, or an
	// agent without --cni-cache-dir).
	ContainerUnknown = "unknown"
)

// AgentAllocation is an allocation with what its agent knows of its container.
type AgentAllocation struct {
	Allocation
	// Container is ContainerLive, ContainerGone or ContainerUnknown.
	Container string `json:"container"`
	// ContainerDetail says how the agent knows.
	ContainerDetail string `json:"container_detail,omitempty"`
	// Unclaimed marks a record the agent keeps in its store but could not
	// claim back: the overlay's rings give the address to another agent
	// (a restored or cloned data dir, a lease taken away) or the overlay
	// is not served. Its container may still use the address, which
	// another agent may hand out too. Its addresses are single hosts.
	Unclaimed bool `json:"unclaimed,omitempty"`
	// Detached says why a live CNI container has no network although it
	// holds its address: its host veth is on no bridge, or on another than
	// its overlay's (the bridge was removed under it); empty when attached
	// or when the agent cannot tell.
	Detached string `json:"detached,omitempty"`
}

// AgentAllocations is GET /overlay-agent/ipam/allocations: every allocation
// the agent holds, in flight ones included, and the unclaimed records of
// its store (AgentAllocation.Unclaimed).
type AgentAllocations struct {
	AgentID     string            `json:"agent_id"`
	Allocations []AgentAllocation `json:"allocations"`
}

// IPAMBridgeUsage is one bridge's address use on an overlay.
type IPAMBridgeUsage struct {
	// Bridge is BridgeMesos or BridgeDocker.
	Bridge string `json:"bridge"`
	// Subnet and Subnet6 are the bridge's sub-subnets ("" when the agent
	// does not serve the overlay, or has no such family).
	Subnet  string `json:"subnet,omitempty"`
	Subnet6 string `json:"subnet6,omitempty"`
	// Used counts the IPv4 addresses containers hold, Used6 the IPv6 ones.
	Used  uint64 `json:"used"`
	Used6 uint64 `json:"used6"`
	// Free counts the IPv4 addresses left to hand out (network, gateway and
	// broadcast excluded); absent when the overlay cannot allocate now.
	Free *uint64 `json:"free,omitempty"`
	// Blocks and Blocks6 are the bridge's IPv4 and IPv6 blocks: its first
	// sub-subnet (origin "lease"), then those it grew (origin "grow": more
	// lease from the masters; "grant": from a peer through the ring).
	Blocks  []IPAMBlockUsage `json:"blocks,omitempty"`
	Blocks6 []IPAMBlockUsage `json:"blocks6,omitempty"`
}

// IPAMBlockUsage is one block of a bridge, with its use. The bridge has a
// gateway (the block's first host) in each.
type IPAMBlockUsage struct {
	Prefix string `json:"prefix"`
	// Origin is "lease", "grow" or "grant".
	Origin string `json:"origin"`
	// Donor is the agent that granted the block (origin "grant").
	Donor string `json:"donor,omitempty"`
	// Used counts the addresses containers hold in the block, Free those
	// left to hand out.
	Used uint64 `json:"used"`
	Free uint64 `json:"free"`
}

// IPAMNetworkUsage is an overlay's address use on one agent.
type IPAMNetworkUsage struct {
	Network string `json:"network"`
	// Ready tells whether allocations can work now; Error says why not.
	Ready   bool              `json:"ready"`
	Error   string            `json:"error,omitempty"`
	Bridges []IPAMBridgeUsage `json:"bridges"`
}

// AgentIPAMStatus is GET /overlay-agent/ipam/status: the agent's address
// use per overlay it has a lease or allocations on.
type AgentIPAMStatus struct {
	AgentID  string             `json:"agent_id"`
	Networks []IPAMNetworkUsage `json:"networks"`
}

// IPAMStatus returns the agent's address use per overlay (every overlay
// when network is empty).
func (c *AgentClient) IPAMStatus(ctx context.Context, network string) (*AgentIPAMStatus, error) {
	var out AgentIPAMStatus
	return &out, Call(ctx, c.http, http.MethodGet, c.base+"/overlay-agent/ipam/status"+networkQuery(network), nil, &out, nil)
}

// IPAMAllocations returns the agent's allocations (every overlay's when
// network is empty).
func (c *AgentClient) IPAMAllocations(ctx context.Context, network string) (*AgentAllocations, error) {
	var out AgentAllocations
	return &out, Call(ctx, c.http, http.MethodGet, c.base+"/overlay-agent/ipam/allocations"+networkQuery(network), nil, &out, nil)
}

func networkQuery(network string) string {
	if network == "" {
		return ""
	}
	return "?" + url.Values{"network": {network}}.Encode()
}
