package master

import (
	"encoding/binary"
	"net/netip"
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
	off := addrOffset(p.base.Addr(), addr)
	shift := uint(addr.BitLen() - p.sliceBits)
	// off fits in 128 bits; slice number = off >> shift, and it fits in 64 bits
	// because slices are capped at 2^62.
	n := shr128(off, shift)
	if n < p.lo || n > p.hi {
		return 0, false
	}
	return n, true
}

// addrAt returns the first address of slice n.
func (p *slicePool) addrAt(n uint64) netip.Addr {
	shift := uint(p.base.Addr().BitLen() - p.sliceBits)
	return addShifted(p.base.Addr(), n, shift)
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

// addrOffset returns a - base as a 128-bit number (hi, lo).
func addrOffset(base, a netip.Addr) [2]uint64 {
	b16, a16 := base.As16(), a.As16()
	bh, bl := binary.BigEndian.Uint64(b16[:8]), binary.BigEndian.Uint64(b16[8:])
	ah, al := binary.BigEndian.Uint64(a16[:8]), binary.BigEndian.Uint64(a16[8:])
	lo := al - bl
	borrow := uint64(0)
	if al < bl {
		borrow = 1
	}
	return [2]uint64{ah - bh - borrow, lo}
}

func shr128(v [2]uint64, s uint) uint64 {
	switch {
	case s == 0:
		return v[1]
	case s >= 128:
		return 0
	case s >= 64:
		return v[0] >> (s - 64)
	default:
		return v[1]>>s | v[0]<<(64-s)
	}
}

// addShifted returns base + (n << shift) in 128-bit arithmetic.
func addShifted(base netip.Addr, n uint64, shift uint) netip.Addr {
	var hi, lo uint64
	switch {
	case shift >= 128:
	case shift >= 64:
		hi = n << (shift - 64)
	case shift == 0:
		lo = n
	default:
		lo = n << shift
		hi = n >> (64 - shift)
	}
	b := base.As16()
	bh, bl := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	rl := bl + lo
	carry := uint64(0)
	if rl < bl {
		carry = 1
	}
	rh := bh + hi + carry
	var out [16]byte
	binary.BigEndian.PutUint64(out[:8], rh)
	binary.BigEndian.PutUint64(out[8:], rl)
	a := netip.AddrFrom16(out)
	if base.Is4() {
		return a.Unmap()
	}
	return a
}

// halves splits a prefix into its two halves (the mesos and docker bridges).
func halves(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits() + 1
	first := netip.PrefixFrom(p.Addr(), bits)
	second := netip.PrefixFrom(addShifted(p.Addr(), 1, uint(p.Addr().BitLen()-bits)), bits)
	return first, second
}
