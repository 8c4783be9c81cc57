// Package record is an agent's record at the masters: the immutable value
// the lease table holds per agent (Agent: what it registered, its VTEP
// addresses and, per overlay, its Lease of Blocks), the agent's last
// configuration report (Report, report.go), and how the two render, under
// the network configuration, as the api.AgentInfo the API serves and the
// record signature covers (Render, render.go; ApplyReport).
//
// It is a package of its own because the record is the one value the
// lease table's rules produce and everything else reads: rendering is a
// pure function of the configuration, the record and the report, and a
// record's encoding in snapshots is its fields' (their JSON tags are the
// disk format: a change breaks the snapshots of earlier masters). It
// imports nothing of master/ but netconfig (cmd/carve/deps_test.go keeps
// it so); master/state decides what records hold.
package record

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/prefixspace"
)

// Agent is one agent's committed record. Records are immutable once
// stored (copy on write), so snapshots, request outcomes and readers share
// them freely.
type Agent struct {
	ID       string
	Hostname string
	IP       netip.Addr // invalid when another agent took the IP
	MeshAddr string
	Bridges  api.AgentNetworkConfig
	// Keys and UnderlayMTU are what the agent registered (signed into its
	// record).
	Keys        api.AgentKeys
	UnderlayMTU int
	VTEP        netip.Addr
	VTEP6       netip.Addr       // invalid without vtep_subnet6
	Leases      map[string]Lease // by overlay name
	Version     uint64
	// Created is the Raft index that created the record (0 for records
	// from before it was kept): a holdings acknowledgement names it, so
	// that one of a deleted and re-registered agent is not mistaken for
	// the new record's.
	Created uint64
	// CarveVersion is the carve version the agent registered with
	// (informational, not signed).
	CarveVersion string
}

// Lease is an agent's share of one overlay.
type Lease struct {
	Subnet  netip.Prefix `json:"subnet,omitzero"`
	Subnet6 netip.Prefix `json:"subnet6,omitzero"`
	// Failed says why the overlay (or its IPv6 part) was left out.
	Failed string `json:"failed,omitempty"`
	// Blocks are every block the agent holds in the overlay, disjoint, in
	// api.SortBlocks order: the halves of Subnet and Subnet6 (origin
	// lease), grown and granted blocks. A block part of which was granted
	// away is replaced by the CIDR decomposition of the rest. Immutable
	// once stored (records are copied on write).
	Blocks []Block `json:"blocks,omitempty"`
}

// leaseEqual tells whether two leases are the same.
func leaseEqual(a, b Lease) bool {
	return a.Subnet == b.Subnet && a.Subnet6 == b.Subnet6 && a.Failed == b.Failed && slices.Equal(a.Blocks, b.Blocks)
}

// Clone is a copy of r to change and store as a new record (copy on
// write); its Leases map is its own, the leases in it are shared values.
func (r *Agent) Clone() *Agent {
	c := *r
	c.Leases = maps.Clone(r.Leases)
	if c.Leases == nil {
		c.Leases = map[string]Lease{}
	}
	return &c
}

// Equal tells whether o records the same as r, but for the version.
func (r *Agent) Equal(o *Agent) bool {
	return r.ID == o.ID && r.Hostname == o.Hostname && r.IP == o.IP && r.MeshAddr == o.MeshAddr &&
		r.Bridges == o.Bridges && r.Keys == o.Keys && r.UnderlayMTU == o.UnderlayMTU && r.CarveVersion == o.CarveVersion &&
		r.VTEP == o.VTEP && r.VTEP6 == o.VTEP6 && r.Created == o.Created && maps.EqualFunc(r.Leases, o.Leases, leaseEqual)
}

// Block is one block of an agent's record (api.Block in the API).
type Block struct {
	Bridge string       `json:"bridge"`
	Prefix netip.Prefix `json:"prefix"`
	Origin string       `json:"origin"`
	Donor  string       `json:"donor,omitempty"`
	// Home is the block as it was committed to this agent, before grants
	// split it; a granted-away part that comes back rejoins the pieces of
	// its home block.
	Home    netip.Prefix `json:"home"`
	Version uint64       `json:"version"`
	// Epoch is the table's restore epoch when the block was leased to
	// this agent (grown, granted, taken back from its quarantine; 0 before
	// any restore, and for blocks leased by masters of v0.4 and earlier). A
	// return decided in an older epoch never means a block leased in a
	// newer one (state's staleReturn). Versions cannot tell: a whole-
	// cluster restore starts a log whose indexes repeat the old one's.
	Epoch uint64 `json:"epoch,omitempty"`
}

// API is the block as the API shows it.
func (b Block) API() api.Block {
	return api.Block{Bridge: b.Bridge, Prefix: b.Prefix.String(), Origin: b.Origin, Donor: b.Donor, Version: b.Version}
}

// HoldsLease tells whether a lease gives the agent address space (and so
// a VTEP its peers route to): as Render lists an overlay.
func HoldsLease(l Lease) bool {
	return l.Subnet.IsValid() || l.Subnet6.IsValid() || len(l.Blocks) > 0
}

// Covers tells whether the lease's blocks cover all of p (a block an agent
// reports as its own is its own at the masters).
func (l Lease) Covers(p netip.Prefix) bool { return covers(l.Blocks, p) }

func covers(blocks []Block, p netip.Prefix) bool {
	for _, b := range blocks {
		if b.Prefix.Contains(p.Addr()) && b.Prefix.Bits() <= p.Bits() {
			return true
		}
	}
	// p may span several blocks: check that its pieces are all held.
	if p.Bits() >= p.Addr().BitLen() {
		return false
	}
	inside := false
	for _, b := range blocks {
		if p.Contains(b.Prefix.Addr()) && b.Prefix.Bits() > p.Bits() {
			inside = true
			break
		}
	}
	if !inside {
		return false
	}
	lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
	return covers(blocks, lo) && covers(blocks, prefixspace.Sibling(lo))
}
