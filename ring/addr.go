package ring

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
)

// universe is the address space of one ring, with every address written as
// its offset from the first one: arithmetic on offsets is family-agnostic.
type universe struct {
	prefix netip.Prefix
	base   Uint128 // the first address as an integer
	size   Uint128 // number of addresses; at most 2^127 (IPv6 ::/0 is refused)
}

func newUniverse(p netip.Prefix) (universe, error) {
	if !p.IsValid() {
		return universe{}, fmt.Errorf("%w: universe %v is not a valid prefix", ErrInvalid, p)
	}
	if p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return universe{}, fmt.Errorf("%w: universe %v must be plain IPv4 or IPv6", ErrInvalid, p)
	}
	if p.Masked() != p {
		return universe{}, fmt.Errorf("%w: universe %v has host bits set", ErrInvalid, p)
	}
	if p.Addr().Is6() && p.Bits() == 0 {
		// 2^128 addresses would overflow every count.
		return universe{}, fmt.Errorf("%w: universe %v is too large", ErrInvalid, p)
	}
	width := p.Addr().BitLen()
	return universe{
		prefix: p,
		base:   addrInt(p.Addr()),
		size:   pow2(width - p.Bits()),
	}, nil
}

func (u universe) is4() bool { return u.prefix.Addr().Is4() }

// offset returns the offset of a inside the universe.
func (u universe) offset(a netip.Addr) (Uint128, bool) {
	if !a.IsValid() || a.Is4() != u.is4() || a.Zone() != "" || !u.prefix.Contains(a) {
		return Uint128{}, false
	}
	return addrInt(a).Sub(u.base), true
}

// addr returns the address at offset off.
func (u universe) addr(off Uint128) netip.Addr { return intAddr(u.base.Add(off), u.is4()) }

// prefixSpan returns the offsets [start, end) covered by p, which must lie in
// the universe.
func (u universe) prefixSpan(p netip.Prefix) (start, end Uint128, err error) {
	if !p.IsValid() || p.Addr().Is4() != u.is4() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
		return Uint128{}, Uint128{}, fmt.Errorf("%w: prefix %v is not of the universe's family (%v)", ErrOutside, p, u.prefix)
	}
	if p.Masked() != p {
		return Uint128{}, Uint128{}, fmt.Errorf("%w: prefix %v has host bits set", ErrNotAligned, p)
	}
	if p.Bits() < u.prefix.Bits() || !u.prefix.Contains(p.Addr()) {
		return Uint128{}, Uint128{}, fmt.Errorf("%w: prefix %v is not inside universe %v", ErrOutside, p, u.prefix)
	}
	start = addrInt(p.Addr()).Sub(u.base)
	return start, start.Add(pow2(p.Addr().BitLen() - p.Bits())), nil
}

func (u universe) rangeOf(lo, hiIncl Uint128) Range {
	return Range{First: u.addr(lo), Last: u.addr(hiIncl)}
}

func addrInt(a netip.Addr) Uint128 {
	if a.Is4() {
		b := a.As4()
		return Uint128{Lo: uint64(binary.BigEndian.Uint32(b[:]))}
	}
	b := a.As16()
	return Uint128{Hi: binary.BigEndian.Uint64(b[:8]), Lo: binary.BigEndian.Uint64(b[8:])}
}

func intAddr(v Uint128, is4 bool) netip.Addr {
	if is4 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(v.Lo))
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], v.Hi)
	binary.BigEndian.PutUint64(b[8:], v.Lo)
	return netip.AddrFrom16(b)
}

// Range is a run of consecutive addresses. Its end is inclusive so that a
// range ending at the top of the address space needs no address past it.
type Range struct {
	First, Last netip.Addr
}

// Size is the number of addresses in r.
func (r Range) Size() Uint128 { return addrInt(r.Last).Sub(addrInt(r.First)).inc() }

// Contains reports whether a lies in r.
func (r Range) Contains(a netip.Addr) bool {
	return a.Is4() == r.First.Is4() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

// Prefixes covers r with the fewest CIDR prefixes, as routes need them.
func (r Range) Prefixes() []netip.Prefix {
	is4 := r.First.Is4()
	width := r.First.BitLen()
	lo, hi := addrInt(r.First), addrInt(r.Last)
	var out []netip.Prefix
	for _, b := range cidrBlocks(lo, hi, width) {
		out = append(out, netip.PrefixFrom(intAddr(b.start, is4), width-b.log2))
	}
	return out
}

// String writes r as first-last.
func (r Range) String() string { return r.First.String() + "-" + r.Last.String() }

// block is an aligned run of 2^log2 addresses starting at start.
type block struct {
	start Uint128
	log2  int
}

// cidrBlocks splits [lo, hi] into maximal aligned blocks, lowest first.
func cidrBlocks(lo, hi Uint128, width int) []block {
	var out []block
	for {
		// The largest block starting at lo is limited by lo's alignment
		// and by the room left up to hi.
		k := lo.trailingZeros()
		if k > width {
			k = width
		}
		room := hi.Sub(lo).inc() // 0 means 2^128: only for a whole IPv6 space
		for k > 0 && !room.IsZero() && (k >= 128 || room.Less(pow2(k))) {
			k--
		}
		out = append(out, block{start: lo, log2: k})
		last := lo.Add(pow2(k)).dec()
		if last.Cmp(hi) >= 0 {
			return out
		}
		lo = last.inc()
	}
}

// ival is an inclusive run of offsets [lo, hi].
type ival struct{ lo, hi Uint128 }

func (v ival) size() Uint128 { return v.hi.Sub(v.lo).inc() }

// coalesce merges touching or overlapping runs of a sorted list.
func coalesce(in []ival) []ival {
	out := make([]ival, 0, len(in))
	for _, v := range in {
		// Offsets stay below 2^127, so hi+1 cannot wrap.
		if n := len(out); n > 0 && !out[n-1].hi.inc().Less(v.lo) {
			if out[n-1].hi.Less(v.hi) {
				out[n-1].hi = v.hi
			}
			continue
		}
		out = append(out, v)
	}
	return out
}

// intersect returns the runs common to two sorted disjoint lists.
func intersect(a, b []ival) []ival {
	var out []ival
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		lo := maxU(a[i].lo, b[j].lo)
		hi := minU(a[i].hi, b[j].hi)
		if !hi.Less(lo) {
			out = append(out, ival{lo, hi})
		}
		if a[i].hi.Less(b[j].hi) {
			i++
		} else {
			j++
		}
	}
	return out
}

// subtract returns the runs of a not in b; both sorted and disjoint.
func subtract(a, b []ival) []ival {
	var out []ival
	j := 0
	for _, v := range a {
		lo := v.lo
		for j < len(b) && b[j].hi.Less(lo) {
			j++
		}
		k := j
		done := false
		for k < len(b) && !v.hi.Less(b[k].lo) {
			if lo.Less(b[k].lo) {
				out = append(out, ival{lo, b[k].lo.dec()})
			}
			if !b[k].hi.Less(v.hi) {
				done = true
				break
			}
			lo = b[k].hi.inc()
			k++
		}
		if !done {
			out = append(out, ival{lo, v.hi})
		}
	}
	return out
}

// union merges two sorted disjoint lists.
func union(a, b []ival) []ival {
	all := make([]ival, 0, len(a)+len(b))
	all = append(all, a...)
	all = append(all, b...)
	sort.Slice(all, func(i, j int) bool { return all[i].lo.Less(all[j].lo) })
	return coalesce(all)
}

func total(in []ival) Uint128 {
	var t Uint128
	for _, v := range in {
		t = t.Add(v.size())
	}
	return t
}
