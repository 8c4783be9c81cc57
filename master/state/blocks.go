package state

import (
	"fmt"
	"net/netip"
	"sort"

	"github.com/carve-net/carve/ring"
)

// blockSpace is the aligned-block allocator of one overlay family: it holds
// non-overlapping CIDR prefixes of the overlay subnet, each with its holder
// (an agent, or the quarantine of a deleted agent's space), and hands out
// the lowest free aligned block of a size (first fit). An agent's first
// lease is a whole free prefix-sized slice; grown blocks are smaller and may
// use what is left of a slice.
type blockSpace struct {
	universe netip.Prefix
	last     ring.Uint128 // offset of the universe's last address
	held     []heldBlock  // sorted by start, disjoint
	// floor is at most the lowest free offset: a first-fit search starts
	// there, so filling the space in order stays O(1) amortised per block.
	floor ring.Uint128
}

// heldBlock is one held prefix, as offsets from the universe's base.
type heldBlock struct {
	first, last ring.Uint128 // inclusive
	prefix      netip.Prefix
	holder      string // agent id; for quarantined space, the deleted agent
	quarantined bool
}

func newBlockSpace(universe netip.Prefix) *blockSpace {
	bits := universe.Addr().BitLen() - universe.Bits()
	last := ring.Uint128{Hi: ^uint64(0), Lo: ^uint64(0)}
	if bits < 128 {
		last = ring.U128(1).Lsh(uint(bits)).Sub(ring.U128(1))
	}
	return &blockSpace{universe: universe, last: last}
}

// span returns p's offsets, and false when p is not inside the universe.
func (s *blockSpace) span(p netip.Prefix) (first, last ring.Uint128, ok bool) {
	if !p.IsValid() || p.Addr().Is4() != s.universe.Addr().Is4() || p.Bits() < s.universe.Bits() || !s.universe.Contains(p.Addr()) {
		return first, last, false
	}
	first = ring.AddrUint128(p.Masked().Addr()).Sub(ring.AddrUint128(s.universe.Addr()))
	size := s.blockSpan(p.Bits())
	return first, first.Add(size), true
}

// blockSpan is the size minus one of a block of prefix length bits.
func (s *blockSpace) blockSpan(bits int) ring.Uint128 {
	host := s.universe.Addr().BitLen() - bits
	if host >= 128 {
		return ring.Uint128{Hi: ^uint64(0), Lo: ^uint64(0)}
	}
	return ring.U128(1).Lsh(uint(host)).Sub(ring.U128(1))
}

// prefixAt is the block of length bits that starts at offset first.
func (s *blockSpace) prefixAt(first ring.Uint128, bits int) netip.Prefix {
	return netip.PrefixFrom(addrPlus(s.universe.Addr(), first), bits)
}

// index is the position of the first held block whose last offset is at or
// after off.
func (s *blockSpace) index(off ring.Uint128) int {
	return sort.Search(len(s.held), func(i int) bool { return !s.held[i].last.Less(off) })
}

// overlapping returns the held blocks that overlap p.
func (s *blockSpace) overlapping(p netip.Prefix) []heldBlock {
	first, last, ok := s.span(p)
	if !ok {
		return nil
	}
	var out []heldBlock
	for i := s.index(first); i < len(s.held) && !last.Less(s.held[i].first); i++ {
		out = append(out, s.held[i])
	}
	return out
}

// add marks p held by holder. It refuses a prefix outside the universe or
// one that overlaps a held block, naming that block's holder.
func (s *blockSpace) add(p netip.Prefix, holder string, quarantined bool) error {
	first, last, ok := s.span(p)
	if !ok {
		return fmt.Errorf("%s is not inside %s", p, s.universe)
	}
	i := s.index(first)
	if i < len(s.held) && !last.Less(s.held[i].first) {
		return fmt.Errorf("%s overlaps %s of %s", p, s.held[i].prefix, s.held[i].describe())
	}
	s.held = append(s.held, heldBlock{})
	copy(s.held[i+1:], s.held[i:])
	s.held[i] = heldBlock{first: first, last: last, prefix: p, holder: holder, quarantined: quarantined}
	if first == s.floor {
		s.advanceFloor()
	}
	return nil
}

// describe names a held block's holder for messages.
func (h heldBlock) describe() string {
	if h.quarantined {
		return fmt.Sprintf("deleted agent %q (quarantined)", h.holder)
	}
	return fmt.Sprintf("agent %q", h.holder)
}

// remove frees p, which must be held exactly (else nothing happens).
func (s *blockSpace) remove(p netip.Prefix) bool {
	first, _, ok := s.span(p)
	if !ok {
		return false
	}
	i := s.index(first)
	if i == len(s.held) || s.held[i].prefix != p {
		return false
	}
	s.held = append(s.held[:i], s.held[i+1:]...)
	if first.Less(s.floor) {
		s.floor = first
	}
	return true
}

// firstFree returns the lowest free aligned block of prefix length bits.
func (s *blockSpace) firstFree(bits int) (netip.Prefix, bool) {
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
		for i < len(s.held) && s.held[i].last.Less(c) {
			i++
		}
		if i == len(s.held) || c.Add(size).Less(s.held[i].first) {
			return s.prefixAt(c, bits), true
		}
		if s.held[i].last == s.last {
			return netip.Prefix{}, false
		}
		c, ok = alignUp(s.held[i].last.Add(ring.U128(1)), host)
	}
	return netip.Prefix{}, false
}

// advanceFloor moves the floor past the held blocks that start at it.
func (s *blockSpace) advanceFloor() {
	for i := s.index(s.floor); i < len(s.held) && s.held[i].first == s.floor; i++ {
		if s.held[i].last == s.last {
			s.floor = s.last // nothing free above: a lower bound still
			return
		}
		s.floor = s.held[i].last.Add(ring.U128(1))
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

// freeSpans returns the free space as inclusive offset ranges (CheckInvariants).
func (s *blockSpace) freeSpans() [][2]ring.Uint128 {
	var out [][2]ring.Uint128
	next, done := ring.Uint128{}, false
	for _, h := range s.held {
		if next.Less(h.first) {
			out = append(out, [2]ring.Uint128{next, h.first.Sub(ring.U128(1))})
		}
		if h.last == s.last {
			done = true
			break
		}
		next = h.last.Add(ring.U128(1))
	}
	if !done {
		out = append(out, [2]ring.Uint128{next, s.last})
	}
	return out
}

// subtractPrefix returns the CIDR decomposition of outer minus inner, which
// must lie inside outer: one prefix per level between them, the sibling of
// inner's ancestor at that level.
func subtractPrefix(outer, inner netip.Prefix) []netip.Prefix {
	if !outer.Contains(inner.Addr()) || inner.Bits() < outer.Bits() {
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

// sibling is the other half of p's parent prefix (p itself for /0).
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

// parent is the prefix one bit shorter that contains p.
func parent(p netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked()
}
