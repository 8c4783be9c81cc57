package agent

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
)

// DefaultCNICacheDir is where libcni-based runtimes cache ADD results.
const DefaultCNICacheDir = ipam.DefaultCNICacheDir

// DefaultReclaimAfter is how long a CNI container's network namespace must
// be gone before the agent releases its addresses: longer than a runtime
// takes to recreate a sandbox, short enough that a crash loop leaks little.
const DefaultReclaimAfter = 5 * time.Minute

// ipamService is what the agent calls on its container address service
// (package ipam, which knows nothing of the agent).
type ipamService interface {
	// Sync hands the IPAM the agent's view; it broadcasts changed rings.
	Sync(ipam.View)
	// Rebuild forgets every ring: the masters' cluster was rebuilt.
	Rebuild(clusterID string)
	// RingGossip handles ipam.RingChannel; UseChannel gives it the channel.
	RingGossip() gossip.Handler
	UseChannel(gossip.Channel)
	// Serve serves the unix-socket API until ctx ends.
	Serve(ctx context.Context, ln net.Listener)
	// List, Status and BridgeSubnets are read for the HTTP API's IPAM view
	// (package ipamview).
	List(network string) *api.Allocations
	// Unclaimed lists the records of the store the IPAM could not claim
	// back, for carve ipam check.
	Unclaimed(network string) []api.Allocation
	Status(network string) *api.IPAMStatus
	BridgeSubnets(network, bridge string) (v4, v6 netip.Prefix, ok bool)
	// Run gives back idle grown blocks and reports grants to the masters;
	// as it returns, the growths and donations in flight have ended.
	Run(ctx context.Context)
	// Close stops the growths and donations in flight and waits for them;
	// the agent calls it before it closes the store.
	Close()
	// BridgeGateways are a bridge's gateways in the blocks it grew, and
	// PeerBlocks the blocks the rings give other agents beyond the subnets
	// the masters route to them (package kernel routes both: kernel.Growth).
	BridgeGateways(network, bridge string) []netip.Prefix
	PeerBlocks(known map[string][]netip.Prefix) map[string][]netip.Prefix
	// BlockCounts are the used and free counts of the blocks of an overlay
	// the ring gives the agent, by prefix (/overlay-agent/overlay).
	BlockCounts(network string) map[string][2]uint64
}

// ipamView is what the IPAM learns from the agent: the masters' cluster id,
// its record, every agent's leased subnets, and the tombstones. The agent's
// own leases are those of the record it runs with: its record joins the
// membership only once it verifies (after the first master state), and the
// IPAM must serve from the leases the agent programmed meanwhile.
//
// Each record's blocks are its agent's lease set in the rings (the records
// of one masters' index never overlap; across versions the rings resolve
// overlaps by version), and this agent's own grown and granted blocks are
// the View's Blocks. stateIndex is the masters' state index merged, epoch
// the restore epoch of the masters' state read last.
func ipamView(clusterID string, self *api.AgentInfo, network *api.NetworkConfig, members membership.State, stateIndex, epoch uint64) ipam.View {
	v := ipam.View{ClusterID: clusterID, Self: self, Network: network, Tombstones: members.Tombstones, StateIndex: stateIndex, RestoreEpoch: epoch}
	for _, r := range members.Records {
		if self != nil && r.ID == self.AgentID && r.Version < self.Version {
			continue
		}
		v.Peers = append(v.Peers, ipam.Peer{ID: r.ID, Version: r.Version, Subnets: r.LeasePrefixes(), ClaimKey: ipam.ParseClaimKey(r.Keys.Claim)})
	}
	if self != nil && !slices.ContainsFunc(v.Peers, func(p ipam.Peer) bool { return p.ID == self.AgentID }) {
		own := membership.NewPeerRecord(self)
		v.Peers = append(v.Peers, ipam.Peer{ID: own.ID, Version: own.Version, Subnets: own.LeasePrefixes(), ClaimKey: ipam.ParseClaimKey(own.Keys.Claim)})
	}
	if self != nil {
		for _, ov := range self.Overlays {
			for _, b := range ov.Blocks {
				p, err := netip.ParsePrefix(b.Prefix)
				if err != nil || b.Origin == api.BlockLeased {
					continue
				}
				mb := ipam.MasterBlock{Overlay: ov.Info.Name, Bridge: b.Bridge, Prefix: p, Version: b.Version}
				if b.Origin == api.BlockGranted {
					mb.Donor = b.Donor
				}
				v.Blocks = append(v.Blocks, mb)
			}
		}
	}
	return v
}

// forgetNeighbour deletes the host's neighbour entry of a container address
// the IPAM freed, on the bridge it was on (see vxlan.Dataplane.
// ForgetNeighbour): a new container given the address is then reached at its
// own MAC at once. Called with the IPAM's lock held; it never waits for a
// reconcile. A failure only costs that wait, so it is logged.
func (a *Agent) forgetNeighbour(bridge string, addr netip.Addr) {
	if a.dp == nil {
		return
	}
	if _, err := a.dp.ForgetNeighbour(bridge, addr); err != nil {
		a.log.Warn("could not delete the neighbour entry of a freed address", "bridge", bridge, "addr", addr, "err", err)
	}
}
