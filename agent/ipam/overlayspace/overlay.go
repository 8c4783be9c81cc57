// Package overlayspace is the address space of one overlay on an agent:
// its ring allocators per family, its bridges and the blocks they hold
// beyond their first sub-subnet, its attachments, and the sync of all that
// from the masters' records and the ring (Seed, LearnMasterBlocks,
// SyncBlocks, judgeRecorded): who on this agent holds which address, and
// the "never twice" rules of docs/design.md ("Giving back", "The space an
// agent allocates in"). It takes no lock and persists nothing: agent/ipam
// owns the table of overlays and its lock, and group-commits the writes
// returned here; what a sync reaches beneath it (the rings on disk, the
// gossip's knowledge, the growth in flight) comes through Sync.
package overlayspace

import (
	"crypto/ed25519"
	"encoding/json"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// families: index 0 is IPv4, 1 is IPv6, in every [2] array of this package.
const families = ipfamily.Count

// Where a bridge's extra block came from (HeldBlock.Origin).
const (
	// OriginGrow is a block the masters leased to this agent on a grow
	// request: it is a lease in the ring, and goes back through
	// BlockSource.Return.
	OriginGrow = "grow"
	// OriginGrant is a block a peer granted through the ring: the ring
	// alone says this agent owns it, and it goes back to its donor with a
	// grant back through the ring.
	OriginGrant = "grant"
)

// Peer is one agent's leases, of every overlay: the blocks of its masters'
// record (its subnets for a record without blocks).
type Peer struct {
	ID      string
	Version uint64 // Raft index of the record the subnets come from
	// Subnets are every block the record lists: each overlay family's
	// are the agent's complete lease set at Version in that ring.
	Subnets []string
	// ClaimKey is the claim key of the agent's record (nil: none): its
	// ring claims verify under it only.
	ClaimKey ed25519.PublicKey
}

// MasterBlock is a grown or granted block the masters' record of this
// agent lists.
type MasterBlock struct {
	Overlay string
	Bridge  string
	Prefix  netip.Prefix
	Version uint64
	// Donor is the agent that granted the block; empty for a grown one.
	Donor string
}

// AllocRecord is a persisted attachment (ipamstore.Alloc).
type AllocRecord ipamstore.Alloc

// Addr returns the record's address of a family (0: IPv4, 1: IPv6).
func (r AllocRecord) Addr(fam int) netip.Addr {
	if fam == 0 {
		return r.V4
	}
	return r.V6
}

// SetAddr sets the record's address of a family.
func (r *AllocRecord) SetAddr(fam int, a netip.Addr) {
	if fam == 0 {
		r.V4 = a
	} else {
		r.V6 = a
	}
}

// Empty tells whether the record holds no address.
func (r AllocRecord) Empty() bool { return !r.V4.IsValid() && !r.V6.IsValid() }

// PutBlock is the store's write of a held block.
func PutBlock(b *HeldBlock) ipamstore.Write {
	data, _ := json.Marshal(b) // strings, numbers and a prefix: cannot fail
	return ipamstore.PutBlock(b.Overlay, b.Family, b.Prefix, data)
}

// DeleteBlock is the store's deletion of a held block.
func DeleteBlock(b *HeldBlock) ipamstore.Write {
	return ipamstore.DeleteBlock(b.Overlay, b.Family, b.Prefix)
}

// Overlay is the address space of one overlay on this agent: one ring
// allocator per address family, seeded from the masters' leases. Its
// owner holds a lock over it (agent/ipam's table lock).
type Overlay struct {
	Name     string
	Info     api.OverlayNetwork     // the overlay's configuration, from the record
	Universe [families]netip.Prefix // the overlay's subnets (invalid: no such family)
	Alloc    [families]*ring.Allocator
	Bridges  map[string][families]netip.Prefix // bridge kind -> its sub-subnets
	// Attached are the overlay's allocations, by attachment.
	Attached map[ring.Attachment]AllocRecord
	// Blocks are the blocks the bridges hold beyond their first
	// sub-subnet, per family, in address order (see package growth).
	Blocks [families][]*HeldBlock
	// Gateways are the bridge gateways reserved in the allocators.
	Gateways map[netip.Addr]bool
	// Unsolicited are the ranges the ring gives this agent that it did not
	// adopt (mayAdopt), counted and logged once each.
	Unsolicited map[netip.Prefix]bool
	// SeedErr is why the ring refused the masters' leases; while it is set
	// the ring may own nothing, and "exhausted" would mislead.
	SeedErr error
	// Unserved, when set, says why the overlay takes no new allocation (it
	// is no longer OK on this agent). Its allocations stay: runtimes look
	// them up and release them while they clean up.
	Unserved string
	// Disabled: unserved because the overlay is disabled (drained): a
	// refusal no retry cures.
	Disabled bool
}

// HeldBlock is one block a bridge holds beyond its first sub-subnet.
type HeldBlock struct {
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
	// shows (SyncBlocks). A block not recorded yet (a grant whose report
	// is on its way, a grow whose record the watch has not brought) is
	// held on the ring's word.
	Recorded bool `json:"recorded,omitempty"`
	// IdleSince is when the block was last seen without an allocation
	// (zero while it holds one); in memory only.
	IdleSince time.Time `json:"-"`
}

// BridgeBlocks returns a bridge's blocks of a family: its first sub-subnet,
// then the blocks it grew, in address order. The caller holds the table's lock.
func (o *Overlay) BridgeBlocks(bridge string, fam int) []netip.Prefix {
	var out []netip.Prefix
	if first := o.Bridges[bridge][fam]; first.IsValid() {
		out = append(out, first)
	}
	for _, b := range o.Blocks[fam] {
		if b.Bridge == bridge {
			out = append(out, b.Prefix)
		}
	}
	return out
}

// FirstBlocks returns the bridges' first sub-subnets of a family.
func (o *Overlay) FirstBlocks(fam int) []netip.Prefix {
	var out []netip.Prefix
	for _, kind := range slices.Sorted(maps.Keys(o.Bridges)) {
		if p := o.Bridges[kind][fam]; p.IsValid() {
			out = append(out, p)
		}
	}
	return out
}

// BlockOf returns the block of the bridge that holds addr (its first
// sub-subnet when none does, so that rendering never fails).
func (o *Overlay) BlockOf(bridge string, addr netip.Addr) netip.Prefix {
	fam := 0
	if addr.Is6() {
		fam = 1
	}
	for _, p := range o.BridgeBlocks(bridge, fam) {
		if p.Contains(addr) {
			return p
		}
	}
	return o.Bridges[bridge][fam]
}

// Held returns the held block of a family that contains p (nil when none).
func (o *Overlay) Held(fam int, p netip.Prefix) *HeldBlock {
	for _, b := range o.Blocks[fam] {
		if b.Prefix.Overlaps(p) {
			return b
		}
	}
	return nil
}

// FreeHosts counts the addresses a bridge can still hand out in a family.
func (o *Overlay) FreeHosts(bridge string, fam int) uint64 {
	a := o.Alloc[fam]
	if a == nil {
		return 0
	}
	var n uint64
	for _, p := range o.BridgeBlocks(bridge, fam) {
		f, ok := a.FreeHosts(p).Uint64()
		if !ok {
			return ^uint64(0)
		}
		n = SatAdd(n, f)
	}
	return n
}

// ReserveGateways takes every bridge block's gateway out of circulation in
// the allocators, so that it is neither handed out nor donated, and a ring
// change that would take it away is refused like one that takes an address
// in use. Gateways not owned (yet) are skipped. The caller holds the table's lock.
func (o *Overlay) ReserveGateways() {
	for fam := range families {
		a := o.Alloc[fam]
		if a == nil {
			continue
		}
		for kind := range o.Bridges {
			for _, p := range o.BridgeBlocks(kind, fam) {
				gw := blockaddr.Gateway(p)
				if o.Gateways[gw] {
					continue
				}
				if owner, _ := a.Ring().Owner(gw); owner == a.Self() && a.Reserve(gw) == nil {
					o.Gateways[gw] = true
				}
			}
		}
	}
}

// UnreserveGateway gives a block's gateway back to the free space.
func (o *Overlay) UnreserveGateway(fam int, p netip.Prefix) {
	gw := blockaddr.Gateway(p)
	if o.Gateways[gw] && o.Alloc[fam] != nil {
		o.Alloc[fam].Unreserve(gw)
		delete(o.Gateways, gw)
	}
}

// UnreserveGateways gives every reserved gateway back (before a re-seed,
// which may move the bridges).
func (o *Overlay) UnreserveGateways() {
	for gw := range o.Gateways {
		fam := 0
		if gw.Is6() {
			fam = 1
		}
		if o.Alloc[fam] != nil {
			o.Alloc[fam].Unreserve(gw)
		}
		delete(o.Gateways, gw)
	}
}

// OwnedBlocks lists the parts of the bridges' blocks of a family that the
// ring gives this agent, in address order. The caller holds the table's lock.
func (o *Overlay) OwnedBlocks(fam int) []netip.Prefix {
	a := o.Alloc[fam]
	if a == nil {
		return nil
	}
	owned := a.Ring().Blocks(a.Self())
	var out []netip.Prefix
	for _, kind := range slices.Sorted(maps.Keys(o.Bridges)) {
		for _, k := range o.BridgeBlocks(kind, fam) {
			for _, w := range owned {
				switch {
				case w.Bits() <= k.Bits() && w.Contains(k.Addr()):
					out = append(out, k)
				case k.Bits() < w.Bits() && k.Contains(w.Addr()):
					out = append(out, w)
				}
			}
		}
	}
	slices.SortFunc(out, func(x, y netip.Prefix) int { return x.Addr().Compare(y.Addr()) })
	return slices.Compact(out)
}

// Counts are the addresses in use and free in a block. The caller holds the table's lock.
func (o *Overlay) Counts(fam int, p netip.Prefix) (used, free uint64) {
	for _, rec := range o.Attached {
		if a := rec.Addr(fam); a.IsValid() && p.Contains(a) {
			used++
		}
	}
	if a := o.Alloc[fam]; a != nil {
		free, _ = a.FreeHosts(p).Uint64()
	}
	return used, free
}

// SatAdd adds counts of addresses, saturating at the largest.
func SatAdd(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}
