// Package prefixspace does arithmetic on IP prefixes and on spaces of
// them, in pure Go with no I/O: the first-fit allocation of aligned blocks
// in a space, the subtraction of a prefix from a block (the CIDR
// decomposition of the rest), containment and overlap, spans of offsets,
// and the numbered equal-size slices of a pool. Addresses are 128-bit
// numbers (ring.Uint128), so IPv4 and IPv6 share every line.
//
// It lives at the module root, next to ring/, rather than under
// master/state/: it knows nothing of leases, agents or Raft, imports
// nothing of ours but ring's 128-bit numbers (its imports test keeps it so),
// and an agent-side package may use it without depending on the masters'
// tree (dependencies point inward). master/state keeps the rules (who
// holds what, quotas, grants); this package keeps the numbers.
//
// This file is the package's whole exported surface; the longer
// algorithms behind it are in space.go and prefix.go.
package prefixspace

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/carve-net/carve/ring"
)

// AddrPlus returns a + off in a's address family (an IPv4 result keeps the
// low 32 bits of the sum).
func AddrPlus(a netip.Addr, off ring.Uint128) netip.Addr {
	return ring.AddrUint128(a).Add(off).Addr(a.Is4())
}

// Contains reports whether inner lies wholly inside outer (both of one
// family): every address of inner is one of outer's.
func Contains(outer, inner netip.Prefix) bool {
	return outer.Contains(inner.Addr()) && inner.Bits() >= outer.Bits()
}

// Halves splits p, which must be shorter than a host prefix, into its two
// halves (an agent's subnet into its mesos and docker bridges).
func Halves(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits() + 1
	first := netip.PrefixFrom(p.Addr(), bits)
	second := netip.PrefixFrom(AddrPlus(p.Addr(), ring.U128(1).Lsh(uint(p.Addr().BitLen()-bits))), bits)
	return first, second
}

// Sibling is the other half of p's parent prefix (p itself for /0).
func Sibling(p netip.Prefix) netip.Prefix { return sibling(p) }

// Parent is the prefix one bit shorter that contains p, which must be
// longer than /0.
func Parent(p netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked()
}

// Subtract returns the CIDR decomposition of outer minus inner, in address
// order: one prefix per level between them, the sibling of inner's
// ancestor at that level. It is nil when inner is outer, and outer alone
// when inner does not lie inside outer.
func Subtract(outer, inner netip.Prefix) []netip.Prefix { return subtract(outer, inner) }

// CutOut returns b without the part inside p: b itself when they do not
// overlap, nothing when b lies inside p, else the decomposition of the rest
// (Subtract).
func CutOut(b, p netip.Prefix) []netip.Prefix {
	switch {
	case !b.Overlaps(p):
		return []netip.Prefix{b}
	case b.Bits() >= p.Bits():
		return nil
	}
	return subtract(b, p)
}

// Span is an inclusive range of offsets from a space's first address; its
// end is inclusive so that a span ending at the top of ::/0 needs no
// offset past it.
type Span struct {
	First, Last ring.Uint128
}

// Overlaps reports whether s and o share an offset.
func (s Span) Overlaps(o Span) bool { return !s.Last.Less(o.First) && !o.Last.Less(s.First) }

// Held is one held prefix of a Space, with its holder and its span.
type Held[H comparable] struct {
	Prefix netip.Prefix
	Holder H
	Span   Span
}

// Space is an aligned-block allocator: it holds non-overlapping prefixes
// of one universe prefix, each with a holder of type H (printed with %v in
// errors, so a Stringer names it), and finds the lowest free aligned block
// of a size (first fit). The zero Space is not usable: call NewSpace.
type Space[H comparable] struct {
	universe netip.Prefix
	last     ring.Uint128 // offset of the universe's last address
	held     []Held[H]    // sorted by start, disjoint
	// floor is at most the lowest free offset: a first-fit search starts
	// there, so filling the space in order stays O(1) amortised per block.
	floor ring.Uint128
}

// NewSpace returns an empty space of the prefixes inside universe.
func NewSpace[H comparable](universe netip.Prefix) *Space[H] {
	s := &Space[H]{universe: universe}
	s.last = s.blockSpan(universe.Bits())
	return s
}

// Universe is the prefix the space divides.
func (s *Space[H]) Universe() netip.Prefix { return s.universe }

// Span returns p's offsets from the universe's first address, and false
// when p is not a prefix inside the universe.
func (s *Space[H]) Span(p netip.Prefix) (Span, bool) {
	if !p.IsValid() || p.Addr().Is4() != s.universe.Addr().Is4() || p.Bits() < s.universe.Bits() || !s.universe.Contains(p.Addr()) {
		return Span{}, false
	}
	first := ring.AddrUint128(p.Masked().Addr()).Sub(ring.AddrUint128(s.universe.Addr()))
	return Span{First: first, Last: first.Add(s.blockSpan(p.Bits()))}, true
}

// Add marks p held by holder. It refuses a prefix outside the universe or
// one that overlaps a held block, naming that block and its holder.
func (s *Space[H]) Add(p netip.Prefix, holder H) error {
	sp, ok := s.Span(p)
	if !ok {
		return fmt.Errorf("%s is not inside %s", p, s.universe)
	}
	i := s.index(sp.First)
	if i < len(s.held) && !sp.Last.Less(s.held[i].Span.First) {
		return fmt.Errorf("%s overlaps %s of %v", p, s.held[i].Prefix, s.held[i].Holder)
	}
	s.held = slices.Insert(s.held, i, Held[H]{Prefix: p, Holder: holder, Span: sp})
	if sp.First == s.floor {
		s.advanceFloor()
	}
	return nil
}

// Remove frees p, which must be held exactly as it was added (else
// nothing happens and it returns false).
func (s *Space[H]) Remove(p netip.Prefix) bool {
	sp, ok := s.Span(p)
	if !ok {
		return false
	}
	i := s.index(sp.First)
	if i == len(s.held) || s.held[i].Prefix != p {
		return false
	}
	s.held = slices.Delete(s.held, i, i+1)
	if sp.First.Less(s.floor) {
		s.floor = sp.First
	}
	return true
}

// RemoveHeld frees p if holder holds exactly p.
func (s *Space[H]) RemoveHeld(p netip.Prefix, holder H) bool {
	for _, h := range s.Overlapping(p) {
		if h.Prefix == p && h.Holder == holder {
			return s.Remove(p)
		}
	}
	return false
}

// Overlapping returns the held blocks that overlap p, in address order
// (none when p is not inside the universe).
func (s *Space[H]) Overlapping(p netip.Prefix) []Held[H] {
	sp, ok := s.Span(p)
	if !ok {
		return nil
	}
	var out []Held[H]
	for i := s.index(sp.First); i < len(s.held) && !sp.Last.Less(s.held[i].Span.First); i++ {
		out = append(out, s.held[i])
	}
	return out
}

// Covers reports whether the held blocks cover all of p (false when p is
// not inside the universe).
func (s *Space[H]) Covers(p netip.Prefix) bool {
	sp, _ := s.Span(p)
	next := sp.First
	for _, h := range s.Overlapping(p) {
		if next.Less(h.Span.First) {
			return false
		}
		if !h.Span.Last.Less(sp.Last) {
			return true
		}
		next = h.Span.Last.Add(ring.U128(1))
	}
	return false
}

// FirstFree returns the lowest free aligned block of prefix length bits,
// and false when none is free (or bits does not fit the universe).
func (s *Space[H]) FirstFree(bits int) (netip.Prefix, bool) { return s.firstFree(bits) }

// Blocks returns the held blocks in address order (a copy).
func (s *Space[H]) Blocks() []Held[H] { return slices.Clone(s.held) }

// Len is the number of held blocks.
func (s *Space[H]) Len() int { return len(s.held) }

// FreeSpans returns the free space as spans, in address order.
func (s *Space[H]) FreeSpans() []Span { return s.freeSpans() }

// Pool hands out, first fit, the equal-size slices of a prefix: the /24s
// of an overlay's /9, or (slices of a host prefix's length) the hosts of
// the VTEP subnet. Slices are numbered from the prefix's first address;
// only numbers in [lo, hi] are ever handed out, and at most 2^62 of them.
// The zero Pool is not usable: call NewPool or NewHostPool.
type Pool struct {
	base      netip.Prefix
	sliceBits int
	lo, hi    uint64
	used      map[uint64]string // slice number -> owner
	// hint is at most the lowest free slice number, so a first-fit search
	// starts there instead of at lo: allocation stays O(1) amortised.
	hint uint64
}

// maxSliceExp bounds the number of slices so that slice numbers (and n+1)
// fit in a uint64.
const maxSliceExp = 62

// NewPool returns the pool of base's slices of prefix length sliceBits
// (at least base.Bits()), all free.
func NewPool(base netip.Prefix, sliceBits int) *Pool {
	exp := min(sliceBits-base.Bits(), maxSliceExp)
	return &Pool{base: base, sliceBits: sliceBits, lo: 0, hi: 1<<uint(exp) - 1, used: map[uint64]string{}}
}

// NewHostPool is the pool of host addresses of a subnet (at most /30 or
// /126), without its first (network) and last (IPv4 broadcast) addresses.
func NewHostPool(base netip.Prefix) *Pool {
	p := NewPool(base, base.Addr().BitLen())
	p.lo, p.hi = 1, p.hi-1
	p.hint = 1
	return p
}

// Number returns the slice number of an address (a slice's or one inside
// it), and whether it is one of this pool's slices.
func (p *Pool) Number(addr netip.Addr) (uint64, bool) {
	if !p.base.Contains(addr) {
		return 0, false
	}
	off := ring.AddrUint128(addr).Sub(ring.AddrUint128(p.base.Addr()))
	// A base of more than 2^64 slices (a VTEP /48) holds addresses whose
	// number does not fit 64 bits: none of them is a slice (at most 2^62).
	n, fits := off.Rsh(p.shift()).Uint64()
	if !fits || n < p.lo || n > p.hi {
		return 0, false
	}
	return n, true
}

// AddrAt returns the first address of slice n.
func (p *Pool) AddrAt(n uint64) netip.Addr {
	return AddrPlus(p.base.Addr(), ring.U128(n).Lsh(p.shift()))
}

// PrefixAt returns slice n as a prefix.
func (p *Pool) PrefixAt(n uint64) netip.Prefix {
	return netip.PrefixFrom(p.AddrAt(n), p.sliceBits)
}

// Allocate takes the lowest free slice for owner; false when none is free.
func (p *Pool) Allocate(owner string) (uint64, bool) {
	// n+1 cannot overflow: slice numbers are below 2^62.
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

// Take marks slice n as owner's (rebuilding from records).
func (p *Pool) Take(n uint64, owner string) { p.used[n] = owner }

// Owner returns the owner of slice n, empty when it is free.
func (p *Pool) Owner(n uint64) string { return p.used[n] }

// Release frees slice n.
func (p *Pool) Release(n uint64) {
	delete(p.used, n)
	if n < p.hint {
		p.hint = n
	}
}

// shift is the number of address bits inside one slice.
func (p *Pool) shift() uint { return uint(p.base.Addr().BitLen() - p.sliceBits) }
