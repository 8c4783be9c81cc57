package ipam

// The exported surface of package ipam, in one file: every exported
// constant, variable, type and function but Service and New (service.go)
// is declared here, and the Service's exported methods, which live beside
// the work they do, are listed here.
//
//	New(Config) (*Service, error)           service.go
//
//	lifecycle  Run                           giveback.go
//	           Close, Sync(View), Rebuild,   service.go
//	           UseChannel
//	           RingGossip, the RingChannel   gossip.go
//	           handler
//	addresses  Allocate, Release,            allocate.go
//	           ReleaseAddress, GC, Lookup
//	           SetOwner                      setowner.go
//	           Serve (the unix socket)       http.go
//	reads      Networks                      service.go
//	           List, Status, BridgeSubnets,  query.go
//	           BridgeGateways, PeerBlocks
//	           Unclaimed                     unclaimed.go
//	           BlockCounts                   usage.go
//	           Rings                         gossip.go
//
// The agent hands the Service what it learns (View, Peer, MasterBlock) and
// the masters' side of growth (BlockSource, with LeasedBlock and
// GrantReport); the wire format of RingChannel is package ipamwire.

import (
	"crypto/ed25519"
	"encoding/base64"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/cnihost"
	"github.com/carve-net/carve/agent/ipam/growth"
	"github.com/carve-net/carve/agent/ipam/masterreport"
	"github.com/carve-net/carve/agent/ipam/overlayspace"
	"github.com/carve-net/carve/agent/ipam/spaceask"
	"github.com/carve-net/carve/api"
)

// RingChannel is the mesh channel that carries every overlay's rings. One
// channel for all of them, because mesh channels must be registered before
// the router starts, and an agent learns its overlays only later.
const RingChannel = "carve-rings"

// DefaultCNICacheDir is where libcni-based runtimes cache ADD results.
const DefaultCNICacheDir = "/var/lib/cni"

// Config configures a Service.
type Config struct {
	// AgentID is this agent's id: the ring peer the allocators act for.
	AgentID string
	// DB is the agent's bbolt store; the IPAM owns its own buckets in it.
	DB *bolt.DB
	// CNICacheDir is the runtime's libcni cache (results/), read to take
	// back the addresses of running containers after a lost disk; empty: none.
	CNICacheDir string
	// Registerer receives the metrics of the IPAM and its ring gossip; nil: none.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Growth configures how a bridge whose blocks fill up gets more space.
	Growth GrowthConfig
	// Reclaim configures the release of the addresses of containers whose
	// network namespace is gone (netnsreclaim.go); the zero value: none.
	Reclaim ReclaimConfig
	// OnSent, when set, counts the bytes of ring gossip sent, by kind
	// (delta, digest, push).
	OnSent func(kind string, n int)
	// ForgetNeighbour, when set, is called for every address a release
	// frees, with the device name of its bridge: once the release is
	// durable, before the address can be handed out again, with the
	// service's lock held (so quick, and never calling the Service). The
	// agent deletes the host's neighbour entry of the address there
	// (neighbour.go).
	ForgetNeighbour func(bridge string, addr netip.Addr)
	// ClaimKey is the agent's claim key (the private half of the
	// AgentKeys.Claim its record carries): it signs every ring token and
	// grant this agent writes, and with it the agent verifies every
	// received claim under its writer's key (claims.go). nil: nothing is
	// signed or verified, only who leases what (--insecure labs, tests).
	ClaimKey ed25519.PrivateKey
}

// Peer is one agent's leases, of every overlay (overlayspace.Peer).
type Peer = overlayspace.Peer

// View is all the IPAM learns from the agent.
type View struct {
	// ClusterID is the masters' cluster; rings of another cluster are refused.
	ClusterID string
	Self      *api.AgentInfo // nil before the first registration
	Network   *api.NetworkConfig
	Peers     []Peer // every known agent, self included
	// Tombstones are the agents the masters deleted.
	Tombstones []api.Tombstone
	// Blocks are the grown and granted blocks the masters' record of this
	// agent lists (beyond each bridge's first sub-subnet).
	Blocks []MasterBlock
	// StateIndex is the index of the masters' state the agent has merged
	// (its tombstones included): what a complete usage report acknowledges.
	StateIndex uint64
	// RestoreEpoch is the masters' restore epoch of the state the agent
	// read last (0: none): a return names it, so that the masters can tell
	// a return decided before a restore (api.ReturnRequest).
	RestoreEpoch uint64
}

// BlockSource is the masters' side of growth (growth.BlockSource).
type BlockSource = growth.BlockSource

// LeasedBlock is a block the masters leased on a grow request
// (growth.LeasedBlock).
type LeasedBlock = growth.LeasedBlock

// GrantReport is a grant through the ring, as the masters learn it
// (growth.GrantReport).
type GrantReport = growth.GrantReport

// ReturnReport gives back a block (growth.ReturnReport).
type ReturnReport = growth.ReturnReport

// MasterBlock is a grown or granted block the masters' record of this
// agent lists (overlayspace.MasterBlock).
type MasterBlock = overlayspace.MasterBlock

// Errors of growth, for callers that branch.
var (
	// ErrMastersExhausted is BlockSource.Grow's answer when the masters have
	// no free block left for the overlay (growth.ErrMastersExhausted).
	ErrMastersExhausted = growth.ErrMastersExhausted
	// ErrQuota is BlockSource.Grow's answer when the masters refused the
	// block for the agent's quota (growth.ErrQuota).
	ErrQuota = growth.ErrQuota
	// errOverlayFull marks a growth that found space nowhere
	// (spaceask.ErrOverlayFull).
	errOverlayFull = spaceask.ErrOverlayFull
	// errNoDonor marks a growth that got no block although peers report
	// free addresses (spaceask.ErrNoDonor).
	errNoDonor = spaceask.ErrNoDonor
	// ErrReportRefused is a BlockSource's answer when the masters refused
	// a grant report or a return for good (not worth sending again).
	ErrReportRefused = masterreport.ErrRefused
)

// GrowthConfig configures growth; the zero value grows through the ring
// only (growth.Config).
type GrowthConfig = growth.Config

// DefaultReclaimNetNSDirs are the directories where runtimes keep network
// namespaces: iproute2, CNI's and Podman's /run/netns (netns-*),
// containerd's cni-* there and its CRI state's netns/.
var DefaultReclaimNetNSDirs = cnihost.DefaultNetNSDirs()

// ReclaimConfig configures the release of allocations whose network
// namespace is gone; the zero value turns it off.
type ReclaimConfig struct {
	// After is how long a namespace must stay missing; 0: never reclaim.
	After time.Duration
	// DryRun logs and counts what would be released, and releases nothing.
	DryRun bool
	// NetNSDirs are the runtime directories whose namespaces are watched
	// (DefaultReclaimNetNSDirs when empty).
	NetNSDirs []string
}

// Where a bridge's extra block came from (heldBlock.Origin).
const (
	// OriginGrow is a block the masters leased to this agent on a grow
	// request (overlayspace.OriginGrow).
	OriginGrow = overlayspace.OriginGrow
	// OriginGrant is a block a peer granted through the ring
	// (overlayspace.OriginGrant).
	OriginGrant = overlayspace.OriginGrant
)

// ParseClaimKey decodes a claim public key as records carry it (standard
// base64 of 32 bytes); nil for none or a malformed one.
func ParseClaimKey(s string) ed25519.PublicKey {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil
	}
	return ed25519.PublicKey(b)
}
