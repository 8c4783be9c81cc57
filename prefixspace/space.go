package prefixspace

import (
	"net/netip"
	"sort"

	"github.com/carve-net/carve/ring"
)

// allOnes is the largest 128-bit number: the last offset of ::/0.
var allOnes = ring.Uint128{Hi: ^uint64(0), Lo: ^uint64(0)}

// blockSpan is the size minus one of a block of prefix length bits in the
// universe's family (the size of a /0 of IPv6 does not fit in 128 bits).
func (s *Space[H]) blockSpan(bits int) ring.Uint128 {
	host := s.universe.Addr().BitLen() - bits
	if host >= 128 {
		return allOnes
	}
	return ring.U128(1).Lsh(uint(host)).Sub(ring.U128(1))
}

// prefixAt is the block of length bits that starts at offset first.
func (s *Space[H]) prefixAt(first ring.Uint128, bits int) netip.Prefix {
	return netip.PrefixFrom(AddrPlus(s.universe.Addr(), first), bits)
}

// index is the position of the first held block whose last offset is at or
// after off.
func (s *Space[H]) index(off ring.Uint128) int {
	return sort.Search(len(s.held), func(i int) bool { return !s.held[i].Span.Last.Less(off) })
}

// firstFree walks the gaps between held blocks from the floor up and
// returns the first aligned block of length bits that fits in one.
func (s *Space[H]) firstFree(bits int) (netip.Prefix, bool) {
	if bits < s.universe.Bits() || bits > s.universe.Addr().BitLen() {
		return netip.Prefix{}, false
	}
	size := s.blockSpan(bits) // the block's size minus one
	host := uint(s.universe.Addr().BitLen() - bits)
	c, ok := alignUp(s.floor, host)
	for i := s.index(s.floor); ok; {
		if s.last.Less(c) || s.last.Sub(c).Less(size) {
			return netip.Prefix{}, false
		}
		for i < len(s.held) && s.held[i].Span.Last.Less(c) {
			i++
		}
		if i == len(s.held) || c.Add(size).Less(s.held[i].Span.First) {
			return s.prefixAt(c, bits), true
		}
		if s.held[i].Span.Last == s.last {
			return netip.Prefix{}, false
		}
		c, ok = alignUp(s.held[i].Span.Last.Add(ring.U128(1)), host)
	}
	return netip.Prefix{}, false
}

// advanceFloor moves the floor past the held blocks that start at it.
func (s *Space[H]) advanceFloor() {
	for i := s.index(s.floor); i < len(s.held) && s.held[i].Span.First == s.floor; i++ {
		if s.held[i].Span.Last == s.last {
			s.floor = s.last // nothing free above: a lower bound still
			return
		}
		s.floor = s.held[i].Span.Last.Add(ring.U128(1))
	}
}

// alignUp rounds x up to a multiple of 2^host; false on overflow.
func alignUp(x ring.Uint128, host uint) (ring.Uint128, bool) {
	if host >= 128 {
		return x, x.IsZero()
	}
	q := x.Rsh(host).Lsh(host)
	if q == x {
		return x, true
	}
	y := q.Add(ring.U128(1).Lsh(host))
	return y, !y.Less(x) && !y.IsZero()
}

// freeSpans lists the gaps between the held blocks.
func (s *Space[H]) freeSpans() []Span {
	var out []Span
	next, done := ring.Uint128{}, false
	for _, h := range s.held {
		if next.Less(h.Span.First) {
			out = append(out, Span{next, h.Span.First.Sub(ring.U128(1))})
		}
		if h.Span.Last == s.last {
			done = true
			break
		}
		next = h.Span.Last.Add(ring.U128(1))
	}
	if !done {
		out = append(out, Span{next, s.last})
	}
	return out
}
