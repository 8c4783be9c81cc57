package ipam

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// Where a bridge's extra block came from (heldBlock.Origin).
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

// blocksBucket holds the blocks a bridge holds beyond its first sub-subnet:
// "<overlay>/<family>/<prefix>" -> heldBlock.
const blocksBucket = "ipam-blocks"

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
	// idleSince is when the block was last seen without an allocation
	// (zero while it holds one); in memory only.
	idleSince time.Time
}

func blockKey(overlay string, fam int, p netip.Prefix) string {
	return overlay + "/" + familyName(fam) + "/" + p.String()
}

func putBlock(b *heldBlock) write {
	data, _ := json.Marshal(b) // strings, numbers and a prefix: cannot fail
	return write{bucket: blocksBucket, key: blockKey(b.Overlay, b.Family, b.Prefix), value: data}
}

func deleteBlock(b *heldBlock) write {
	return write{bucket: blocksBucket, key: blockKey(b.Overlay, b.Family, b.Prefix)}
}

// loadBlocks reads the persisted blocks, by overlay.
func loadBlocks(tx *bolt.Tx) (map[string][]*heldBlock, error) {
	out := map[string][]*heldBlock{}
	err := tx.Bucket([]byte(blocksBucket)).ForEach(func(k, v []byte) error {
		var b heldBlock
		if err := json.Unmarshal(v, &b); err != nil || !b.Prefix.IsValid() || b.Family < 0 || b.Family >= families ||
			blockKey(b.Overlay, b.Family, b.Prefix) != string(k) {
			return fmt.Errorf("corrupt block record %q", k)
		}
		out[b.Overlay] = append(out[b.Overlay], &b)
		return nil
	})
	return out, err
}

// gatewayOf is the gateway of a block: its first host address.
func gatewayOf(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next() }

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

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
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
				gw := gatewayOf(p)
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
	gw := gatewayOf(p)
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

// uncovered returns the parts of p that no cover contains, as CIDR blocks.
func uncovered(p netip.Prefix, covers []netip.Prefix) []netip.Prefix {
	overlaps := false
	for _, c := range covers {
		if c.Bits() <= p.Bits() && c.Contains(p.Addr()) {
			return nil
		}
		if c.Overlaps(p) {
			overlaps = true
		}
	}
	if !overlaps || p.Bits() >= p.Addr().BitLen() {
		return []netip.Prefix{p}
	}
	lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
	hi := netip.PrefixFrom(lastAddr(lo).Next(), p.Bits()+1)
	return append(uncovered(lo, covers), uncovered(hi, covers)...)
}

// lastAddr is the last address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// syncBlocks brings the held blocks of a family in line with the ring: a
// range this agent owns outside its own leases and outside the blocks it
// knows is a grant (from an answer, from gossip, or one it held before its
// data dir was lost): it becomes a block of the bridge that asked for space
// (the mesos bridge when none did). A held block whose gateway the ring no
// longer gives this agent is dropped. It returns the writes, and whether
// new blocks were adopted. The caller holds s.mu.
func (s *Service) syncBlocks(o *overlay, fam int) (writes []write, adopted bool) {
	a := o.alloc[fam]
	if a == nil || len(o.bridges) == 0 {
		return nil, false
	}
	r := a.Ring()
	firsts := o.firstBlocks(fam)
	var keep []*heldBlock
	for _, b := range o.blocks[fam] {
		if first, inside := overlapsAny(firsts, b.Prefix); inside {
			// A block this agent granted, given back: it is part of
			// the bridge's first sub-subnet again, not a prefix of its own.
			o.unreserveGateway(fam, b.Prefix)
			s.log.Info("a block given back merged into the bridge's first block", "overlay", o.name, "block", b.Prefix, "into", first)
			writes = append(writes, deleteBlock(b))
			continue
		}
		if owner, _ := r.Owner(gatewayOf(b.Prefix)); owner != s.id {
			o.unreserveGateway(fam, b.Prefix)
			s.log.Warn("a block is no longer this agent's in the ring: dropped", "overlay", o.name, "block", b.Prefix, "origin", b.Origin, "owner", owner)
			writes = append(writes, deleteBlock(b))
			continue
		}
		keep = append(keep, b)
	}
	o.blocks[fam] = keep
	// What this agent owns inside a bridge's first sub-subnet is that
	// bridge's (a grant given back merges into it), and so is what its
	// leases and held blocks cover.
	covers := slices.Clone(firsts)
	for _, l := range r.Leases() {
		if l.Owner == s.id {
			covers = append(covers, l.Prefix)
		}
	}
	for _, b := range o.blocks[fam] {
		covers = append(covers, b.Prefix)
	}
	bridge := s.askingBridge(o.name, fam)
	if _, ok := o.bridges[bridge]; !ok {
		bridge = sortedKeys(o.bridges)[len(o.bridges)-1] // mesos sorts after docker
	}
	minBits := minBlockBits(fam)
	for _, owned := range r.Blocks(s.id) {
		for _, p := range uncovered(owned, covers) {
			if p.Bits() > minBits {
				continue // too small to hold a gateway and a container
			}
			b := &heldBlock{Overlay: o.name, Family: fam, Bridge: bridge, Prefix: p, Origin: OriginGrant, Donor: s.leaseOwner(r, p)}
			o.blocks[fam] = append(o.blocks[fam], b)
			writes = append(writes, putBlock(b))
			adopted = true
			s.log.Info("block granted through the ring", "overlay", o.name, "bridge", bridge, "block", p, "donor", b.Donor)
		}
	}
	slices.SortFunc(o.blocks[fam], func(x, y *heldBlock) int { return x.Prefix.Addr().Compare(y.Prefix.Addr()) })
	o.reserveGateways()
	return writes, adopted
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

// overlapsAny returns the first of ps that overlaps p.
func overlapsAny(ps []netip.Prefix, p netip.Prefix) (netip.Prefix, bool) {
	for _, q := range ps {
		if q.Overlaps(p) {
			return q, true
		}
	}
	return netip.Prefix{}, false
}

// leaseOwner is the owner of the lease holding p ("" when none): where a
// granted block goes back to.
func (s *Service) leaseOwner(r *ring.Ring, p netip.Prefix) string {
	for _, l := range r.Leases() {
		if l.Prefix.Contains(p.Addr()) && l.Owner != s.id {
			return l.Owner
		}
	}
	return ""
}

// minBlockBits is the longest prefix a block may have: four addresses, a
// network address, a gateway, a container and (IPv4) a broadcast address.
func minBlockBits(fam int) int {
	if fam == 1 {
		return 126
	}
	return 30
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

// describeBlocks names blocks for messages.
func describeBlocks(ps []netip.Prefix) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, ", ")
}

// familyOf is the family index of an address.
func familyOf(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// bridgeAddressOf returns the prefix of a bridge (its blocks) of which
// addr is the network, broadcast (IPv4) or gateway address: an address no
// container may hold, since the kernel routes it as the bridge's own.
func bridgeAddressOf(blocks []netip.Prefix, addr netip.Addr) (netip.Prefix, bool) {
	for _, p := range blocks {
		if !p.Contains(addr) {
			continue
		}
		if addr == p.Masked().Addr() || addr == gatewayOf(p) || (addr.Is4() && addr == lastAddr(p)) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
