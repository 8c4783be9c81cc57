package state

import (
	"net/netip"

	"github.com/carve-net/carve/ring"
)

// slicePool hands out, first fit, the equal-size slices of a prefix: the
// /24s of an overlay's /9, or (with sliceBits = 32) the hosts of the VTEP
// subnet. Slices are numbered from the prefix's base; only numbers in
// [lo, hi] are ever handed out.
type slicePool struct {
	base      netip.Prefix
	sliceBits int
	lo, hi    uint64
	used      map[uint64]string // slice number -> agent id
	// hint is at most the lowest free slice number, so a first-fit search
	// starts there instead of at lo: allocation stays O(1) amortised.
	hint uint64
}

// maxSliceExp bounds the number of slices so that slice numbers fit in a uint64.
const maxSliceExp = 62

func newSlicePool(base netip.Prefix, sliceBits int) *slicePool {
	exp := sliceBits - base.Bits()
	if exp > maxSliceExp {
		exp = maxSliceExp
	}
	return &slicePool{base: base, sliceBits: sliceBits, lo: 0, hi: 1<<uint(exp) - 1, used: map[uint64]string{}}
}

// newHostPool is the pool of host addresses of an IPv4 subnet, without its
// network and broadcast addresses.
func newHostPool(base netip.Prefix) *slicePool {
	p := newSlicePool(base, base.Addr().BitLen())
	p.lo, p.hi = 1, p.hi-1
	p.hint = 1
	return p
}

// number returns the slice number of a prefix (or address), and whether it
// is one of this pool's slices.
func (p *slicePool) number(addr netip.Addr) (uint64, bool) {
	if !p.base.Contains(addr) {
		return 0, false
	}
	off := ring.AddrUint128(addr).Sub(ring.AddrUint128(p.base.Addr()))
	// Slice numbers fit in 64 bits: pools are capped at 2^62 slices.
	n, _ := off.Rsh(p.shift()).Uint64()
	if n < p.lo || n > p.hi {
		return 0, false
	}
	return n, true
}

// shift is the number of address bits inside one slice.
func (p *slicePool) shift() uint { return uint(p.base.Addr().BitLen() - p.sliceBits) }

// addrAt returns the first address of slice n.
func (p *slicePool) addrAt(n uint64) netip.Addr {
	return addrPlus(p.base.Addr(), ring.U128(n).Lsh(p.shift()))
}

// prefixAt returns slice n as a prefix.
func (p *slicePool) prefixAt(n uint64) netip.Prefix {
	return netip.PrefixFrom(p.addrAt(n), p.sliceBits)
}

// allocate takes the lowest free slice for owner. Slice numbers are capped
// at 2^62, so n+1 cannot overflow.
func (p *slicePool) allocate(owner string) (uint64, bool) {
	for n := max(p.hint, p.lo); n <= p.hi; n++ {
		if _, taken := p.used[n]; !taken {
			p.used[n] = owner
			p.hint = n + 1
			return n, true
		}
	}
	p.hint = p.hi + 1
	return 0, false
}

// take marks slice n as owned (rebuilding from records).
func (p *slicePool) take(n uint64, owner string) { p.used[n] = owner }

// release frees slice n.
func (p *slicePool) release(n uint64) {
	delete(p.used, n)
	if n < p.hint {
		p.hint = n
	}
}

// addrPlus returns a + off, in a's address family.
func addrPlus(a netip.Addr, off ring.Uint128) netip.Addr {
	return ring.AddrUint128(a).Add(off).Addr(a.Is4())
}

// halves splits a prefix into its two halves (the mesos and docker bridges).
func halves(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits() + 1
	first := netip.PrefixFrom(p.Addr(), bits)
	second := netip.PrefixFrom(addrPlus(p.Addr(), ring.U128(1).Lsh(uint(p.Addr().BitLen()-bits))), bits)
	return first, second
}
