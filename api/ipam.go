package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"
)

// The agent's IPAM service speaks JSON over HTTP on a unix socket
// (--socket, /run/carve/agent.sock by default). Every call names the overlay
// ("network") and is idempotent by (network, container id, interface name).

// Bridge kinds an allocation is made for: the bridge's sub-subnet bounds it.
const (
	BridgeMesos  = "mesos"  // m-<overlay>, CNI containers
	BridgeDocker = "docker" // d-<overlay>, Docker
)

// IPAM error codes (in Error.Code), besides the generic ones.
const (
	// CodeNotReady: the agent has no lease for the overlay yet (try again later).
	CodeNotReady = "not_ready"
	// CodeTaken: a claimed address belongs to another attachment.
	CodeTaken = "taken"
	// CodeNotOwned: a requested address is not in this agent's space (the
	// message names the agent whose it is).
	CodeNotOwned = "not_owned"
	// CodeBridgeAddress: a requested address is a bridge block's network,
	// broadcast or gateway address.
	CodeBridgeAddress = "bridge_address"
)

// IPAMRequest names one attachment (container interface) on an overlay.
type IPAMRequest struct {
	Network     string `json:"network"`
	ContainerID string `json:"container_id"`
	IfName      string `json:"ifname"`
	// Bridge is BridgeMesos (default) or BridgeDocker.
	Bridge string `json:"bridge,omitempty"`
	// Address claims a specific address (an IP, without prefix) instead of
	// the lowest free one: a container that still uses it after the agent
	// lost its disk, or Docker's preferred address.
	Address string `json:"address,omitempty"`
	// Addresses are more requested addresses (the CNI "ips" capability,
	// IP= in CNI_ARGS): with Address, at most one per family. A requested
	// address is given exactly, or the allocation fails saying why (taken,
	// and by whom; another agent's space, and whose; a bridge address).
	Addresses []string `json:"addresses,omitempty"`
	// Owner is the container the allocation is for, as its runtime named
	// it; it is recorded with the allocation (nil: none given).
	Owner *Owner `json:"owner,omitempty"`
	// Family limits the allocation to "4" or "6"; empty means every family
	// the overlay has.
	Family string `json:"family,omitempty"`
}

// IPConfig is one allocated address.
type IPConfig struct {
	// Address is the container's address with the bridge sub-subnet's prefix.
	Address string `json:"address"`
	Gateway string `json:"gateway"`
}

// Route is a route for the container.
type Route struct {
	Dst string `json:"dst"`
	GW  string `json:"gw,omitempty"`
}

// Allocation is an attachment's addresses.
type Allocation struct {
	Network     string     `json:"network"`
	ContainerID string     `json:"container_id"`
	IfName      string     `json:"ifname"`
	Bridge      string     `json:"bridge"`
	IPs         []IPConfig `json:"ips"`
	Routes      []Route    `json:"routes,omitempty"`
	MTU         int        `json:"mtu,omitempty"`
	// Owner is the container the allocation belongs to (absent for
	// allocations recorded before carve kept owners).
	Owner *Owner `json:"owner,omitempty"`
}

// GCRequest releases every allocation of the network not in Keep.
type GCRequest struct {
	Network string `json:"network"`
	// Bridge limits the collection to one bridge kind, so that a CNI runtime's
	// list of live attachments never frees Docker's; empty means every bridge.
	Bridge string `json:"bridge,omitempty"`
	// Keep lists the live attachments; an entry with an empty IfName keeps
	// every interface of that container.
	Keep []IPAMRequest `json:"keep"`
}

// Released lists what a release or a gc freed.
type Released struct {
	Released []Allocation `json:"released"`
}

// Allocations is a listing.
type Allocations struct {
	Allocations []Allocation `json:"allocations"`
}

// IPAMStatus tells whether allocations on a network can work now.
type IPAMStatus struct {
	Network string `json:"network"`
	Ready   bool   `json:"ready"`
	Error   string `json:"error,omitempty"`
	// Free is the number of free addresses per bridge kind (IPv4), in all
	// of the bridge's blocks.
	Free map[string]uint64 `json:"free,omitempty"`
	// Blocks are each bridge kind's IPv4 blocks, Blocks6 the IPv6 ones.
	Blocks  map[string][]IPAMBlockUsage `json:"blocks,omitempty"`
	Blocks6 map[string][]IPAMBlockUsage `json:"blocks6,omitempty"`
}

// IPAMClient talks to an agent's IPAM service over its unix socket.
type IPAMClient struct {
	http *http.Client
	sock string
}

// ErrAgentUnreachable marks a failure to reach the agent at all (the CNI
// plugin answers "try again later").
var ErrAgentUnreachable = errors.New("carve agent unreachable")

// NewIPAMClient returns a client for the agent socket at path.
func NewIPAMClient(path string, timeout time.Duration) *IPAMClient {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}
	return &IPAMClient{http: &http.Client{Transport: tr, Timeout: timeout}, sock: path}
}

// Allocate returns the attachment's addresses, allocating them if needed.
func (c *IPAMClient) Allocate(ctx context.Context, req IPAMRequest) (*Allocation, error) {
	var out Allocation
	return &out, c.do(ctx, http.MethodPost, "/ipam/allocate", req, &out)
}

// Release frees the attachment's addresses (success when there are none).
func (c *IPAMClient) Release(ctx context.Context, req IPAMRequest) (*Released, error) {
	var out Released
	return &out, c.do(ctx, http.MethodPost, "/ipam/release", req, &out)
}

// Lookup returns the attachment's addresses (not_found when none).
func (c *IPAMClient) Lookup(ctx context.Context, req IPAMRequest) (*Allocation, error) {
	q := url.Values{"network": {req.Network}, "container_id": {req.ContainerID}, "ifname": {req.IfName}}
	var out Allocation
	return &out, c.do(ctx, http.MethodGet, "/ipam/lookup?"+q.Encode(), nil, &out)
}

// List returns every allocation on a network (all networks when empty).
func (c *IPAMClient) List(ctx context.Context, network string) (*Allocations, error) {
	var out Allocations
	return &out, c.do(ctx, http.MethodGet, "/ipam/allocations?"+url.Values{"network": {network}}.Encode(), nil, &out)
}

// GC releases every allocation of the network that is not live.
func (c *IPAMClient) GC(ctx context.Context, req GCRequest) (*Released, error) {
	var out Released
	return &out, c.do(ctx, http.MethodPost, "/ipam/gc", req, &out)
}

// Status tells whether allocations on the network can work now.
func (c *IPAMClient) Status(ctx context.Context, network string) (*IPAMStatus, error) {
	var out IPAMStatus
	return &out, c.do(ctx, http.MethodGet, "/ipam/status?"+url.Values{"network": {network}}.Encode(), nil, &out)
}

func (c *IPAMClient) do(ctx context.Context, method, path string, in, out any) error {
	err := Call(ctx, c.http, method, "http://carve-agent"+path, in, out, nil)
	if errors.Is(err, ErrUnreachable) {
		return fmt.Errorf("%w at %s: %v", ErrAgentUnreachable, c.sock, err)
	}
	return err
}
