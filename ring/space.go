package ring

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
)

// space is the address space of one peer: the ranges it owns (one per ring
// token) and, inside them, the free addresses as sorted runs. Runs are never
// joined across a range boundary, so each lies in exactly one range. An
// address that is owned and not free is in use. Not safe for concurrent use.
type space struct {
	u     universe
	owned []ival // sorted, disjoint, one per ring range
	free  []ival // sorted, disjoint, each inside one owned run
	nfree Uint128
}

// newSpace returns an empty space of the universe.
func newSpace(universe netip.Prefix) (*space, error) {
	u, err := newUniverse(universe)
	if err != nil {
		return nil, err
	}
	return &space{u: u}, nil
}

// Owned returns the ranges the space holds, in address order.
func (s *space) Owned() []Range {
	out := make([]Range, len(s.owned))
	for i, v := range s.owned {
		out[i] = s.u.rangeOf(v.lo, v.hi)
	}
	return out
}

// FreeCount is the number of free addresses.
func (s *space) FreeCount() Uint128 { return s.nfree }

// FreeByRange returns the free count of every owned range, keyed by its
// first address, as Ring.ReportFree takes it.
func (s *space) FreeByRange() map[netip.Addr]Uint128 {
	out := make(map[netip.Addr]Uint128, len(s.owned))
	j := 0
	for _, o := range s.owned {
		var n Uint128
		for j < len(s.free) && !o.hi.Less(s.free[j].lo) {
			n = n.Add(s.free[j].size())
			j++
		}
		out[s.u.addr(o.lo)] = n
	}
	return out
}

func (s *space) rangesToIvals(ranges []Range) ([]ival, error) {
	out := make([]ival, 0, len(ranges))
	for _, r := range ranges {
		lo, ok1 := s.u.offset(r.First)
		hi, ok2 := s.u.offset(r.Last)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%w: range %v", ErrOutside, r)
		}
		if hi.Less(lo) {
			return nil, fmt.Errorf("%w: range %v is reversed", ErrInvalid, r)
		}
		if n := len(out); n > 0 && !out[n-1].hi.Less(lo) {
			return nil, fmt.Errorf("%w: ranges not sorted and disjoint at %v", ErrInvalid, r)
		}
		out = append(out, ival{lo, hi})
	}
	return out, nil
}

func (s *space) setOwned(owned []ival) error {
	oldSet, newSet := coalesce(s.owned), coalesce(owned)
	lost := subtract(oldSet, newSet)
	freeSet := coalesce(s.free)
	if busy := subtract(lost, freeSet); len(busy) > 0 {
		return &TakeoverError{Range: s.u.rangeOf(busy[0].lo, busy[0].hi)}
	}
	freeSet = union(intersect(freeSet, newSet), subtract(newSet, oldSet))
	// Cut the free runs at range boundaries.
	var free []ival
	j := 0
	for _, o := range owned {
		for j < len(freeSet) && freeSet[j].hi.Less(o.lo) {
			j++
		}
		for k := j; k < len(freeSet) && !o.hi.Less(freeSet[k].lo); k++ {
			free = append(free, ival{maxU(o.lo, freeSet[k].lo), minU(o.hi, freeSet[k].hi)})
		}
	}
	s.owned = slices.Clone(owned)
	s.free = free
	s.nfree = total(free)
	return nil
}

// InUse reports whether any owned address of r is in use.
func (s *space) InUse(r Range) bool {
	lo, ok1 := s.u.offset(r.First)
	hi, ok2 := s.u.offset(r.Last)
	if !ok1 || !ok2 || hi.Less(lo) {
		return false
	}
	q := []ival{{lo, hi}}
	return len(subtract(intersect(coalesce(s.owned), q), coalesce(s.free))) > 0
}

// ownedAt returns the index of the owned run holding x, or -1.
func (s *space) ownedAt(x Uint128) int {
	i := sort.Search(len(s.owned), func(i int) bool { return x.Less(s.owned[i].lo) }) - 1
	if i >= 0 && !s.owned[i].hi.Less(x) {
		return i
	}
	return -1
}

// freeAt returns the index of the first free run that ends at or after x.
func (s *space) freeAt(x Uint128) int {
	return sort.Search(len(s.free), func(i int) bool { return !s.free[i].hi.Less(x) })
}

// take removes x from free run i, which holds it.
func (s *space) take(i int, x Uint128) {
	v := s.free[i]
	switch {
	case v.lo == v.hi:
		s.free = slices.Delete(s.free, i, i+1)
	case x == v.lo:
		s.free[i].lo = x.inc()
	case x == v.hi:
		s.free[i].hi = x.dec()
	default:
		s.free[i].hi = x.dec()
		s.free = slices.Insert(s.free, i+1, ival{x.inc(), v.hi})
	}
	s.nfree = s.nfree.dec()
}

// hostSpan returns the offsets a subnet may hand out: never its network
// address nor its first host (the gateway), nor, in IPv4, its broadcast
// address.
func (s *space) hostSpan(subnet netip.Prefix) (lo, hi Uint128, ok bool, err error) {
	start, end, err := s.u.prefixSpan(subnet)
	if err != nil {
		return Uint128{}, Uint128{}, false, err
	}
	lo, hi = start.Add(U128(2)), end.dec()
	if s.u.is4() {
		hi = hi.dec()
	}
	if end.Sub(start).Less(U128(4)) || hi.Less(lo) {
		return Uint128{}, Uint128{}, false, nil
	}
	return lo, hi, true, nil
}

// AllocateAfter hands out the first free address of subnet (for example a
// bridge's sub-subnet) after last, wrapping to the subnet's first host:
// round-robin, so that an address freed now is handed out again only after
// the others (see Allocator.Allocate). Never the subnet's network, gateway or
// broadcast address. An invalid last, or one outside the subnet's hosts,
// starts after the highest address in use there (the lowest free address
// when none is): where round-robin left off, unless it had wrapped.
func (s *space) AllocateAfter(subnet netip.Prefix, last netip.Addr) (netip.Addr, error) {
	lo, hi, ok, err := s.hostSpan(subnet)
	if err != nil {
		return netip.Addr{}, err
	}
	if !ok {
		return netip.Addr{}, fmt.Errorf("%w: %v has no host addresses", ErrFull, subnet)
	}
	start := lo
	if x, ok := s.u.offset(last); ok && !x.Less(lo) && !hi.Less(x) {
		if x != hi {
			start = x.inc()
		}
	} else if busy := s.inUseIn(lo, hi); len(busy) > 0 && busy[len(busy)-1].hi != hi {
		start = busy[len(busy)-1].hi.inc()
	}
	if i := s.freeAt(start); i < len(s.free) && !hi.Less(s.free[i].lo) {
		x := maxU(start, s.free[i].lo)
		s.take(i, x)
		return s.u.addr(x), nil
	}
	return s.allocate(lo, hi, subnet.String()) // wrap: nothing free from start on
}

// inUseIn returns the owned addresses of [lo, hi] that are not free, as
// sorted runs.
func (s *space) inUseIn(lo, hi Uint128) []ival {
	return subtract(intersect(coalesce(s.owned), []ival{{lo, hi}}), coalesce(s.free))
}

func (s *space) allocate(lo, hi Uint128, where string) (netip.Addr, error) {
	i := s.freeAt(lo)
	if i == len(s.free) || hi.Less(s.free[i].lo) {
		return netip.Addr{}, fmt.Errorf("%w in %s", ErrFull, where)
	}
	x := maxU(lo, s.free[i].lo)
	s.take(i, x)
	return s.u.addr(x), nil
}

// Claim takes a specific address, which must be owned and free.
func (s *space) Claim(a netip.Addr) error {
	x, ok := s.u.offset(a)
	if !ok {
		return fmt.Errorf("%w: %v", ErrOutside, a)
	}
	if i := s.freeAt(x); i < len(s.free) && !x.Less(s.free[i].lo) {
		s.take(i, x)
		return nil
	}
	if s.ownedAt(x) < 0 {
		return fmt.Errorf("%w: %v", ErrNotOwned, a)
	}
	return fmt.Errorf("%w: %v", ErrAddressInUse, a)
}

// Release makes an address in use free again.
func (s *space) Release(a netip.Addr) error {
	x, ok := s.u.offset(a)
	if !ok {
		return fmt.Errorf("%w: %v", ErrOutside, a)
	}
	o := s.ownedAt(x)
	if o < 0 {
		return fmt.Errorf("%w: %v", ErrNotOwned, a)
	}
	i := s.freeAt(x)
	if i < len(s.free) && !x.Less(s.free[i].lo) {
		return fmt.Errorf("%w: %v", ErrNotAllocated, a)
	}
	own := s.owned[o]
	// Join the neighbouring runs when they touch x inside the same range.
	joinPrev := i > 0 && !s.free[i-1].lo.Less(own.lo) && s.free[i-1].hi.inc() == x
	joinNext := i < len(s.free) && !own.hi.Less(s.free[i].hi) && x.inc() == s.free[i].lo
	switch {
	case joinPrev && joinNext:
		s.free[i-1].hi = s.free[i].hi
		s.free = slices.Delete(s.free, i, i+1)
	case joinPrev:
		s.free[i-1].hi = x
	case joinNext:
		s.free[i].lo = x
	default:
		s.free = slices.Insert(s.free, i, ival{x, x})
	}
	s.nfree = s.nfree.inc()
	return nil
}

// FreeHosts counts the free addresses of subnet that Allocate may hand out
// (its network, gateway and, in IPv4, broadcast address excluded).
func (s *space) FreeHosts(subnet netip.Prefix) Uint128 {
	lo, hi, ok, err := s.hostSpan(subnet)
	if err != nil || !ok {
		return Uint128{}
	}
	return total(intersect(s.free, []ival{{lo, hi}}))
}

// FreeBlock returns the highest CIDR-aligned block of 2^log2 free addresses
// that lies inside one owned range and inside one of the within prefixes
// (the highest, because a bridge's first allocations fill from the bottom).
// ok is false when there is none.
func (s *space) FreeBlock(within []netip.Prefix, log2 int) (p netip.Prefix, ok bool) {
	width := s.u.prefix.Addr().BitLen()
	if log2 < 0 || log2 > width {
		return netip.Prefix{}, false
	}
	var win []ival
	for _, w := range within {
		start, end, err := s.u.prefixSpan(w)
		if err == nil {
			win = append(win, ival{start, end.dec()})
		}
	}
	sort.Slice(win, func(i, j int) bool { return win[i].lo.Less(win[j].lo) })
	// Free runs are cut at range boundaries and intersect keeps the cuts,
	// so each piece lies in one range.
	pieces := intersect(s.free, coalesce(win))
	size := pow2(log2)
	for i := len(pieces) - 1; i >= 0; i-- {
		bs := cidrBlocks(pieces[i].lo, pieces[i].hi, width)
		for j := len(bs) - 1; j >= 0; j-- {
			if b := bs[j]; b.log2 >= log2 {
				start := b.start.Add(pow2(b.log2)).Sub(size)
				return netip.PrefixFrom(s.u.addr(start), width-log2), true
			}
		}
	}
	return netip.Prefix{}, false
}
