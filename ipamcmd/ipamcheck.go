package ipamcmd

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/carve-net/carve/agent/dockeripam"
	"github.com/carve-net/carve/api"
)

// Kinds of problem carve ipam check reports.
const (
	problemDuplicate   = "duplicate"   // an address held by two attachments
	problemOutside     = "outside"     // an address outside its agent's leased range
	problemLeak        = "leak"        // an address whose container is gone
	problemUnreachable = "unreachable" // an agent whose allocations could not be read
	problemDetached    = "detached"    // a live container whose bridge no longer exists
	problemUntracked   = "untracked"   // a running Docker container's address its agent does not hold
	problemUnseen      = "unseen"      // an agent whose Docker engine's containers could not be listed
)

// holder is an attachment holding an address.
type holder struct {
	AgentID     string `json:"agent_id"`
	ContainerID string `json:"container_id,omitempty"`
	IfName      string `json:"ifname,omitempty"`
	Bridge      string `json:"bridge,omitempty"`
	// Unclaimed: the agent keeps the record but its ring gives the address
	// to another agent (api.AgentAllocation.Unclaimed).
	Unclaimed bool `json:"unclaimed,omitempty"`
	// DockerName is set for a running Docker container as its engine lists
	// it (ContainerID is then the engine's container id).
	DockerName string `json:"docker_name,omitempty"`
}

func (h holder) String() string {
	if h.DockerName != "" {
		return h.AgentID + "/docker container " + h.DockerName + " [" + shortContainerID(h.ContainerID) + "]"
	}
	if h.ContainerID == "" {
		return h.AgentID
	}
	return h.AgentID + "/" + h.ContainerID + "/" + h.IfName
}

// ipamProblem is one finding of carve ipam check.
type ipamProblem struct {
	Kind    string   `json:"kind"`
	Network string   `json:"network,omitempty"`
	Address string   `json:"address,omitempty"`
	Holders []holder `json:"holders"`
	Detail  string   `json:"detail"`
}

// key identifies a problem across two reads.
func (p ipamProblem) key() string {
	hs := make([]string, len(p.Holders))
	for i, h := range p.Holders {
		hs[i] = h.String()
	}
	return p.Kind + "|" + p.Network + "|" + p.Address + "|" + strings.Join(hs, ",")
}

// ipamSnapshot is one read of the cluster's addresses: the masters' state,
// every agent's allocations, and why some agents could not be read.
type ipamSnapshot struct {
	State       *api.State
	Allocations map[string]*api.AgentAllocations // by agent id
	Failed      map[string]string                // agent id -> error
	Status      map[string]*api.AgentIPAMStatus  // by agent id: the blocks each agent reports (ring ownership)
	// Docker is, by agent id, what each agent's Docker plugin lists of its
	// engine's running containers (absent: the plugin is off).
	Docker map[string]*dockeripam.Status
}

// checkIPAM finds, in one read, the addresses held twice, those outside
// their agent's leased range for the bridge, those whose container the
// agent knows to be gone, and the agents that could not be read. The
// problems come sorted.
func checkIPAM(snap ipamSnapshot) []ipamProblem {
	var problems []ipamProblem
	for id, err := range snap.Failed {
		problems = append(problems, ipamProblem{Kind: problemUnreachable, Holders: []holder{{AgentID: id}},
			Detail: "its allocations could not be read: " + err})
	}
	type place struct{ network, addr string }
	holders := map[place][]holder{}
	records := map[string]*api.AgentInfo{}
	for i := range snap.State.Agents {
		records[snap.State.Agents[i].AgentID] = &snap.State.Agents[i]
	}
	for id, list := range snap.Allocations {
		rec := records[id]
		for _, al := range list.Allocations {
			h := holder{AgentID: id, ContainerID: al.ContainerID, IfName: al.IfName, Bridge: al.Bridge, Unclaimed: al.Unclaimed}
			if al.Container == api.ContainerGone {
				problems = append(problems, ipamProblem{Kind: problemLeak, Network: al.Network, Address: joinAddresses(al.IPs),
					Holders: []holder{h}, Detail: "the container is gone: " + al.ContainerDetail})
			}
			if al.Detached != "" {
				problems = append(problems, ipamProblem{Kind: problemDetached, Network: al.Network, Address: joinAddresses(al.IPs),
					Holders: []holder{h}, Detail: "the container has no network: " + al.Detached + "; restart it (its runtime's DEL and ADD attach it again)"})
			}
			for _, ip := range al.IPs {
				p, err := netip.ParsePrefix(ip.Address)
				if err != nil {
					problems = append(problems, ipamProblem{Kind: problemOutside, Network: al.Network, Address: ip.Address,
						Holders: []holder{h}, Detail: "the agent reports an address that does not parse: " + err.Error()})
					continue
				}
				addr := p.Addr().Unmap()
				k := place{al.Network, addr.String()}
				holders[k] = append(holders[k], h)
				if why := outsideLease(rec, snap.Status[id], records, al.Network, al.Bridge, addr); why != "" {
					problems = append(problems, ipamProblem{Kind: problemOutside, Network: al.Network, Address: addr.String(),
						Holders: []holder{h}, Detail: why})
				}
			}
		}
	}
	problems = append(problems, checkDocker(snap, func(network, addr string) []holder { return holders[place{network, addr}] })...)
	for k, hs := range holders {
		if len(hs) < 2 {
			continue
		}
		slices.SortFunc(hs, func(a, b holder) int { return strings.Compare(a.String(), b.String()) })
		names := make([]string, len(hs))
		for i, h := range hs {
			names[i] = h.String()
		}
		detail := fmt.Sprintf("held by %d attachments: %s", len(hs), strings.Join(names, ", "))
		for _, h := range hs {
			if h.Unclaimed {
				detail += fmt.Sprintf("; %s keeps it in its store without owning it (a restored or cloned data dir?)", h)
			}
		}
		problems = append(problems, ipamProblem{Kind: problemDuplicate, Network: k.network, Address: k.addr, Holders: hs, Detail: detail})
	}
	slices.SortFunc(problems, func(a, b ipamProblem) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Network, b.Network), compareAddr(a.Address, b.Address),
			cmp.Compare(a.key(), b.key()))
	})
	return problems
}

// outsideLease says why addr is outside the space the agent holds for the
// bridge on the overlay ("" when inside). That space is every block of the
// bridge in the masters' record (its first lease, the blocks it grew and
// those granted to it; a donor's record lists only what it kept), or the
// bridge's first sub-subnet for a record without blocks of the family. A
// grant the masters have not learned yet counts too: a block of origin
// grant that the agent reports in its IPAM status (its ring's ownership),
// provided the masters still give it to the named donor.
func outsideLease(rec *api.AgentInfo, st *api.AgentIPAMStatus, records map[string]*api.AgentInfo, network, bridge string, addr netip.Addr) string {
	if rec == nil {
		return "the agent is not in the masters' state"
	}
	ov := rec.Overlay(network)
	if ov == nil {
		return fmt.Sprintf("agent %s has no lease on overlay %s", rec.AgentID, network)
	}
	held := blocksOf(ov, bridge, addr.Is6())
	if len(held) == 0 {
		var br *api.BridgeInfo
		switch bridge {
		case api.BridgeMesos:
			br = ov.MesosBridge
		case api.BridgeDocker:
			br = ov.DockerBridge
		}
		if br == nil {
			return fmt.Sprintf("agent %s has no %s bridge lease on overlay %s", rec.AgentID, bridge, network)
		}
		lease := br.IP
		if addr.Is6() {
			lease = br.IP6
		}
		p, err := netip.ParsePrefix(lease)
		if err != nil {
			return fmt.Sprintf("agent %s has no IPv%d range on the %s bridge of overlay %s", rec.AgentID, map[bool]int{true: 6, false: 4}[addr.Is6()], bridge, network)
		}
		held = []netip.Prefix{p.Masked()}
	}
	for _, p := range held {
		if p.Contains(addr) {
			return ""
		}
	}
	if pendingGrant(st, records, network, bridge, addr) {
		return ""
	}
	names := make([]string, len(held))
	for i, p := range held {
		names[i] = p.String()
	}
	return fmt.Sprintf("outside agent %s's %s blocks %s on overlay %s", rec.AgentID, bridge, strings.Join(names, ", "), network)
}

// blocksOf are the overlay's blocks of the bridge in one family, from the
// masters' record.
func blocksOf(ov *api.AgentOverlay, bridge string, v6 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, b := range ov.Blocks {
		p, err := netip.ParsePrefix(b.Prefix)
		if err != nil || b.Bridge != bridge || p.Addr().Is6() != v6 {
			continue
		}
		out = append(out, p.Masked())
	}
	return out
}

// pendingGrant says whether the agent reports a block of origin grant for
// the bridge (st) that holds addr, and the masters still give that block to
// its donor: a grant made through the ring that they have not learned yet.
func pendingGrant(st *api.AgentIPAMStatus, records map[string]*api.AgentInfo, network, bridge string, addr netip.Addr) bool {
	if st == nil {
		return false
	}
	for _, nu := range st.Networks {
		if nu.Network != network {
			continue
		}
		for _, bu := range nu.Bridges {
			if bu.Bridge != bridge {
				continue
			}
			for _, b := range append(slices.Clone(bu.Blocks), bu.Blocks6...) {
				p, err := netip.ParsePrefix(b.Prefix)
				if err != nil || b.Origin != api.BlockGranted || !p.Masked().Contains(addr) {
					continue
				}
				if donorHolds(records[b.Donor], network, p.Masked()) {
					return true
				}
			}
		}
	}
	return false
}

// donorHolds says whether the masters give the whole of p to the agent of
// rec on the overlay (inside one of its blocks, of any bridge).
func donorHolds(rec *api.AgentInfo, network string, p netip.Prefix) bool {
	if rec == nil {
		return false
	}
	ov := rec.Overlay(network)
	if ov == nil {
		return false
	}
	for _, br := range []string{api.BridgeMesos, api.BridgeDocker} {
		for _, b := range blocksOf(ov, br, p.Addr().Is6()) {
			if b.Bits() <= p.Bits() && b.Contains(p.Addr()) {
				return true
			}
		}
	}
	return false
}

// confirmProblems keeps the problems of the second read that the first
// read showed too, so that an allocation in flight (an ADD between the
// IPAM and the runtime's cache, an address moving between agents) is not
// reported; a problem of an agent that could not be read the first time
// needs no confirmation, nor does an unreachable agent.
func confirmProblems(first []ipamProblem, firstFailed map[string]string, second []ipamProblem) []ipamProblem {
	seen := map[string]bool{}
	for _, p := range first {
		seen[p.key()] = true
	}
	var out []ipamProblem
	for _, p := range second {
		keep := seen[p.key()] || p.Kind == problemUnreachable
		for _, h := range p.Holders {
			if _, failed := firstFailed[h.AgentID]; failed {
				keep = true
			}
		}
		if keep {
			out = append(out, p)
		}
	}
	return out
}

func joinAddresses(ips []api.IPConfig) string {
	var out []string
	for _, ip := range ips {
		if p, err := netip.ParsePrefix(ip.Address); err == nil {
			out = append(out, p.Addr().String())
		} else {
			out = append(out, ip.Address)
		}
	}
	return strings.Join(out, ",")
}

// compareAddr orders addresses numerically, and what does not parse after.
func compareAddr(a, b string) int {
	first := func(s string) string { s, _, _ = strings.Cut(s, ","); return s }
	x, errX := netip.ParseAddr(first(a))
	y, errY := netip.ParseAddr(first(b))
	switch {
	case errX == nil && errY == nil:
		return x.Compare(y)
	case errX == nil:
		return -1
	case errY == nil:
		return 1
	}
	return strings.Compare(a, b)
}
