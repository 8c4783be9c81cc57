package ipam

import (
	"net/netip"
	"strings"

	"github.com/carve-net/carve/ring"
)

// gatewayOf is the gateway of a block: its first host address.
func gatewayOf(p netip.Prefix) netip.Addr { return p.Masked().Addr().Next() }

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
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
func leaseOwner(r *ring.Ring, self string, p netip.Prefix) string {
	for _, l := range r.Leases() {
		if l.Prefix.Contains(p.Addr()) && l.Owner != self {
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

// describeBlocks names blocks for messages.
func describeBlocks(ps []netip.Prefix) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, ", ")
}

// hostCount is how many addresses of a block Allocate may hand out.
func hostCount(p netip.Prefix) ring.Uint128 {
	n := ring.U128(1).Lsh(uint(p.Addr().BitLen() - p.Bits())).Sub(ring.U128(2))
	if p.Addr().Is4() {
		n = n.Sub(ring.U128(1))
	}
	return n
}
