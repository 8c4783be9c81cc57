package prefixspace

import (
	"net/netip"
	"sort"

	"github.com/carve-net/carve/ring"
)

// subtract builds outer minus inner level by level: at each prefix length
// between them, inner's ancestor is kept out and its sibling is a piece.
func subtract(outer, inner netip.Prefix) []netip.Prefix {
	if !Contains(outer, inner) {
		return []netip.Prefix{outer}
	}
	var out []netip.Prefix
	for bits := outer.Bits() + 1; bits <= inner.Bits(); bits++ {
		anc := netip.PrefixFrom(inner.Addr(), bits).Masked()
		out = append(out, sibling(anc))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr().Less(out[j].Addr()) })
	return out
}

// sibling flips the lowest network bit of p's address.
func sibling(p netip.Prefix) netip.Prefix {
	if p.Bits() == 0 {
		return p
	}
	host := uint(p.Addr().BitLen() - p.Bits())
	a := ring.AddrUint128(p.Addr())
	bit := ring.U128(1).Lsh(host)
	if a.Rsh(host).Lo&1 == 1 {
		a = a.Sub(bit)
	} else {
		a = a.Add(bit)
	}
	return netip.PrefixFrom(a.Addr(p.Addr().Is4()), p.Bits())
}
