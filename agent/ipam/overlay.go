package ipam

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// families: index 0 is IPv4, 1 is IPv6, in every [2] array of this package.
const families = ipfamily.Count

// overlay is the address space of one overlay on this agent: one ring
// allocator per address family, seeded from the masters' leases.
type overlay struct {
	name     string
	info     api.OverlayNetwork     // the overlay's configuration, from the record
	universe [families]netip.Prefix // the overlay's subnets (invalid: no such family)
	alloc    [families]*ring.Allocator
	bridges  map[string][families]netip.Prefix // bridge kind -> its sub-subnets
	attached map[ring.Attachment]allocRecord
	// blocks are the blocks the bridges hold beyond their first
	// sub-subnet, per family, in address order (see package growth).
	blocks [families][]*heldBlock
	// gateways are the bridge gateways reserved in the allocators.
	gateways map[netip.Addr]bool
	// unsolicited are the ranges the ring gives this agent that it did not
	// adopt (mayAdopt), counted and logged once each.
	unsolicited map[netip.Prefix]bool
	// seedErr is why the ring refused the masters' leases; while it is set
	// the ring may own nothing, and "exhausted" would mislead.
	seedErr error
	// unserved, when set, says why the overlay takes no new allocation (it
	// is no longer OK on this agent). Its allocations stay: runtimes look
	// them up and release them while they clean up.
	unserved string
	// disabled: unserved because the overlay is disabled (drained): a
	// refusal no retry cures.
	disabled bool
}

func sortedAttachments(m map[ring.Attachment]allocRecord) []ring.Attachment {
	out := make([]ring.Attachment, 0, len(m))
	for at := range m {
		out = append(out, at)
	}
	slices.SortFunc(out, func(a, b ring.Attachment) int {
		return strings.Compare(a.ContainerID+"\x00"+a.Interface, b.ContainerID+"\x00"+b.Interface)
	})
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// heldBlock is one block a bridge holds beyond its first sub-subnet.
type heldBlock struct {
	Overlay string       `json:"overlay"`
	Family  int          `json:"family"` // 0: IPv4, 1: IPv6
	Bridge  string       `json:"bridge"`
	Prefix  netip.Prefix `json:"prefix"`
	Origin  string       `json:"origin"`
	// Donor is the peer that granted the block (OriginGrant).
	Donor string `json:"donor,omitempty"`
	// Version is the Raft index of the masters' lease (OriginGrow).
	Version uint64 `json:"version,omitempty"`
	// Recorded is set once the masters' record of this agent listed the
	// block: from then on that record is its authority, and a record that
	// no longer lists it (a restore) takes it away, whatever the ring
	// shows (syncBlocks). A block not recorded yet (a grant whose report
	// is on its way, a grow whose record the watch has not brought) is
	// held on the ring's word.
	Recorded bool `json:"recorded,omitempty"`
	// idleSince is when the block was last seen without an allocation
	// (zero while it holds one); in memory only.
	idleSince time.Time
}

// bridgeBlocks returns a bridge's blocks of a family: its first sub-subnet,
// then the blocks it grew, in address order. The caller holds s.mu.
func (o *overlay) bridgeBlocks(bridge string, fam int) []netip.Prefix {
	var out []netip.Prefix
	if first := o.bridges[bridge][fam]; first.IsValid() {
		out = append(out, first)
	}
	for _, b := range o.blocks[fam] {
		if b.Bridge == bridge {
			out = append(out, b.Prefix)
		}
	}
	return out
}

// firstBlocks returns the bridges' first sub-subnets of a family.
func (o *overlay) firstBlocks(fam int) []netip.Prefix {
	var out []netip.Prefix
	for _, kind := range sortedKeys(o.bridges) {
		if p := o.bridges[kind][fam]; p.IsValid() {
			out = append(out, p)
		}
	}
	return out
}

// blockOf returns the block of the bridge that holds addr (its first
// sub-subnet when none does, so that rendering never fails).
func (o *overlay) blockOf(bridge string, addr netip.Addr) netip.Prefix {
	fam := 0
	if addr.Is6() {
		fam = 1
	}
	for _, p := range o.bridgeBlocks(bridge, fam) {
		if p.Contains(addr) {
			return p
		}
	}
	return o.bridges[bridge][fam]
}

// held returns the held block of a family that contains p (nil when none).
func (o *overlay) held(fam int, p netip.Prefix) *heldBlock {
	for _, b := range o.blocks[fam] {
		if b.Prefix.Overlaps(p) {
			return b
		}
	}
	return nil
}

// freeHosts counts the addresses a bridge can still hand out in a family.
func (o *overlay) freeHosts(bridge string, fam int) uint64 {
	a := o.alloc[fam]
	if a == nil {
		return 0
	}
	var n uint64
	for _, p := range o.bridgeBlocks(bridge, fam) {
		f, ok := a.FreeHosts(p).Uint64()
		if !ok {
			return ^uint64(0)
		}
		n = satAdd(n, f)
	}
	return n
}

// reserveGateways takes every bridge block's gateway out of circulation in
// the allocators, so that it is neither handed out nor donated, and a ring
// change that would take it away is refused like one that takes an address
// in use. Gateways not owned (yet) are skipped. The caller holds s.mu.
func (o *overlay) reserveGateways() {
	for fam := range families {
		a := o.alloc[fam]
		if a == nil {
			continue
		}
		for kind := range o.bridges {
			for _, p := range o.bridgeBlocks(kind, fam) {
				gw := blockaddr.Gateway(p)
				if o.gateways[gw] {
					continue
				}
				if owner, _ := a.Ring().Owner(gw); owner == a.Self() && a.Reserve(gw) == nil {
					o.gateways[gw] = true
				}
			}
		}
	}
}

// unreserveGateway gives a block's gateway back to the free space.
func (o *overlay) unreserveGateway(fam int, p netip.Prefix) {
	gw := blockaddr.Gateway(p)
	if o.gateways[gw] && o.alloc[fam] != nil {
		o.alloc[fam].Unreserve(gw)
		delete(o.gateways, gw)
	}
}

// unreserveGateways gives every reserved gateway back (before a re-seed,
// which may move the bridges).
func (o *overlay) unreserveGateways() {
	for gw := range o.gateways {
		fam := 0
		if gw.Is6() {
			fam = 1
		}
		if o.alloc[fam] != nil {
			o.alloc[fam].Unreserve(gw)
		}
		delete(o.gateways, gw)
	}
}

// blockUsage is one block of a bridge as the status shows it.
func (s *Service) blockUsage(o *overlay, bridge string, fam int) []api.IPAMBlockUsage {
	var out []api.IPAMBlockUsage
	for i, p := range o.bridgeBlocks(bridge, fam) {
		u := api.IPAMBlockUsage{Prefix: p.String(), Origin: "lease"}
		if i > 0 || p != o.bridges[bridge][fam] {
			if b := o.held(fam, p); b != nil {
				u.Origin, u.Donor = b.Origin, b.Donor
			}
		}
		for _, rec := range o.attached {
			if rec.Bridge == bridge && p.Contains(rec.addr(fam)) {
				u.Used++
			}
		}
		if a := o.alloc[fam]; a != nil {
			u.Free, _ = a.FreeHosts(p).Uint64()
		}
		out = append(out, u)
	}
	return out
}

// satAdd adds counts of addresses, saturating at the largest.
func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}
