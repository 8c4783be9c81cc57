// Package blockaddr is the arithmetic of the blocks a bridge holds (pure,
// no I/O): a block's gateway, last, network and broadcast addresses and
// which of them no container may hold, how many hosts a block has and the
// longest block, the parts of a prefix no other block covers, the owner
// of the lease a granted block goes back to, and the allocation of a host
// address that is none of the bridge's own.
package blockaddr

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/carve-net/carve/ring"
)

// Gateway is the gateway of a block: its first host address.
func Gateway(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next() }

// Uncovered returns the parts of p that no cover contains, as CIDR blocks.
func Uncovered(p netip.Prefix, covers []netip.Prefix) []netip.Prefix {
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
	hi := netip.PrefixFrom(Last(lo).Next(), p.Bits()+1)
	return append(Uncovered(lo, covers), Uncovered(hi, covers)...)
}

// Last is the last address of a prefix.
func Last(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// OverlapsAny returns the first of ps that overlaps p.
func OverlapsAny(ps []netip.Prefix, p netip.Prefix) (netip.Prefix, bool) {
	for _, q := range ps {
		if q.Overlaps(p) {
			return q, true
		}
	}
	return netip.Prefix{}, false
}

// LeaseOwner is the owner of the lease holding p ("" when none): where a
// granted block goes back to.
func LeaseOwner(r *ring.Ring, self string, p netip.Prefix) string {
	for _, l := range r.Leases() {
		if l.Prefix.Contains(p.Addr()) && l.Owner != self {
			return l.Owner
		}
	}
	return ""
}

// MinBits is the longest prefix a block may have: four addresses, a
// network address, a gateway, a container and (IPv4) a broadcast address.
func MinBits(fam int) int {
	if fam == 1 {
		return 126
	}
	return 30
}

// Describe names blocks for messages.
func Describe(ps []netip.Prefix) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, ", ")
}

// HostCount is how many addresses of a block Allocate may hand out.
func HostCount(p netip.Prefix) ring.Uint128 {
	n := ring.U128(1).Lsh(uint(p.Addr().BitLen() - p.Bits())).Sub(ring.U128(2))
	if p.Addr().Is4() {
		n = n.Sub(ring.U128(1))
	}
	return n
}

// BridgeAddressOf returns the prefix of a bridge (its blocks) of which
// addr is the network, broadcast (IPv4) or gateway address: an address no
// container may hold, since the kernel routes it as the bridge's own.
func BridgeAddressOf(blocks []netip.Prefix, addr netip.Addr) (netip.Prefix, bool) {
	for _, p := range blocks {
		if !p.Contains(addr) {
			continue
		}
		if addr == p.Masked().Addr() || addr == Gateway(p) || (addr.Is4() && addr == Last(p)) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// ErrBridgeAddress refuses an address the bridge itself answers for.
var ErrBridgeAddress = errors.New("the bridge answers for it")

// BridgeAddressError refuses a requested address that is block p's network,
// broadcast or gateway address (BridgeAddressOf): it says which, and the
// host addresses of the block to ask for instead.
func BridgeAddressError(claim netip.Addr, bridge string, p netip.Prefix) error {
	what := "gateway"
	switch {
	case claim == p.Masked().Addr():
		what = "network address"
	case claim.Is4() && claim == Last(p):
		what = "broadcast address"
	}
	first, last := Gateway(p).Next(), Last(p)
	if last.Is4() {
		last = last.Prev()
	}
	fix := "ask for none and carve chooses one"
	if first.IsValid() && last.IsValid() && first.Compare(last) <= 0 {
		fix = fmt.Sprintf("ask for one from %s to %s, or for none and carve chooses one", first, last)
	}
	return fmt.Errorf("requested address %s is the %s of the %s bridge's block %s (%w): %s", claim, what, bridge, p.Masked(), ErrBridgeAddress, fix)
}

// AllocateHost allocates the attachment an address of the bridge's blocks,
// in order, that is no block's network, broadcast or gateway address (see
// BridgeAddressOf): the rule holds whatever the blocks are, even nested
// ones. Such an address the allocator offers is reserved while the others
// are tried, then given back to the free space.
func AllocateHost(alloc *ring.Allocator, at ring.Attachment, blocks []netip.Prefix) (netip.Addr, error) {
	var skipped []netip.Addr
	defer func() {
		for _, a := range skipped {
			alloc.Unreserve(a)
		}
	}()
	for _, p := range blocks {
		for {
			addr, err := alloc.Allocate(at, p)
			if errors.Is(err, ring.ErrFull) {
				break
			}
			if err != nil {
				return netip.Addr{}, err
			}
			if _, edge := BridgeAddressOf(blocks, addr); !edge {
				return addr, nil
			}
			alloc.Release(at)
			if err := alloc.Reserve(addr); err != nil {
				return netip.Addr{}, err
			}
			skipped = append(skipped, addr)
		}
	}
	return netip.Addr{}, fmt.Errorf("%w: no host address left", ring.ErrFull)
}
