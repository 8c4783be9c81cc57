package ring

// What only the tests use: the allocator's whole state and its restore, a
// peer's ranges one by one, the release of many attachments at once. (No
// peer takes over another's ranges: a deleted agent's ranges go back
// through its tombstone and the leases, and a token written in another's
// lease counts for nothing.)

import (
	"fmt"
	"net/netip"
	"sort"
)

// RangesOf returns the ranges peer owns, one per token, in address order.
func (r *Ring) RangesOf(peer string) []Range {
	var out []Range
	for _, v := range r.ownedIvalsIndexed(peer) {
		out = append(out, r.u.rangeOf(v.lo, v.hi))
	}
	return out
}

// Lookup returns the address held by an attachment.
func (a *Allocator) Lookup(at Attachment) (netip.Addr, bool) {
	addr, ok := a.byAttach[at]
	return addr, ok
}

// ReleaseContainer frees every address of a container and returns them.
func (a *Allocator) ReleaseContainer(containerID string) []Allocation {
	return a.releaseWhere(func(at Attachment) bool { return at.ContainerID == containerID })
}

// GC frees every address whose attachment is not in keep and returns them.
// A kept attachment with an empty Interface keeps every interface of its
// container.
func (a *Allocator) GC(keep []Attachment) []Allocation {
	exact := map[Attachment]bool{}
	whole := map[string]bool{}
	for _, k := range keep {
		if k.Interface == "" {
			whole[k.ContainerID] = true
		}
		exact[k] = true
	}
	return a.releaseWhere(func(at Attachment) bool { return !exact[at] && !whole[at.ContainerID] })
}

func (a *Allocator) releaseWhere(match func(Attachment) bool) []Allocation {
	var out []Allocation
	for at, addr := range a.byAttach {
		if match(at) {
			out = append(out, Allocation{at, addr})
		}
	}
	sortAllocations(out)
	for _, al := range out {
		a.unbind(al)
	}
	return out
}

func sortAllocations(as []Allocation) {
	sort.Slice(as, func(i, j int) bool { return as[i].Addr.Less(as[j].Addr) })
}

// Allocations returns every address handed out, in address order.
func (a *Allocator) Allocations() []Allocation {
	out := make([]Allocation, 0, len(a.byAttach))
	for at, addr := range a.byAttach {
		out = append(out, Allocation{at, addr})
	}
	sortAllocations(out)
	return out
}

// State is the full state of an allocator, for persistence: the space is
// derived from it, so it is not stored.
type State struct {
	Self        string
	Ring        []byte // Ring.Encode
	Allocations []Allocation
	Reserved    []netip.Addr
}

// State exports the allocator.
func (a *Allocator) State() State {
	return State{Self: a.self, Ring: a.ring.Encode(), Allocations: a.Allocations(), Reserved: a.Reserved()}
}

// RestoreAllocator rebuilds an allocator from an exported state, checking
// that every address is owned by the peer and held once.
func RestoreAllocator(st State) (*Allocator, error) {
	r, err := Decode(st.Ring)
	if err != nil {
		return nil, fmt.Errorf("restore ring: %w", err)
	}
	a, err := NewAllocator(st.Self, r.u.prefix)
	if err != nil {
		return nil, err
	}
	if err := a.space.setOwned(ownedIvals(r.u, r.st.view, a.self)); err != nil {
		return nil, err
	}
	a.ring = r
	for _, al := range st.Allocations {
		if err := a.Claim(al.Attachment, al.Addr); err != nil {
			return nil, fmt.Errorf("restore %v: %w", al, err)
		}
	}
	for _, addr := range st.Reserved {
		if a.reserved[addr] {
			return nil, fmt.Errorf("%w: %v reserved twice", ErrInvalid, addr)
		}
		if err := a.Reserve(addr); err != nil {
			return nil, fmt.Errorf("restore reserved %v: %w", addr, err)
		}
	}
	return a, nil
}

// SetOwned makes the space hold exactly the given ranges (sorted, disjoint),
// keeping the addresses in use and making new ones free. If a range that
// goes away holds an address in use it returns a *TakeoverError and changes
// nothing.
func (s *space) SetOwned(ranges []Range) error {
	owned, err := s.rangesToIvals(ranges)
	if err != nil {
		return err
	}
	return s.setOwned(owned)
}

// AllocateIn hands out the lowest free address of r, with no exclusion.
func (s *space) AllocateIn(r Range) (netip.Addr, error) {
	lo, ok1 := s.u.offset(r.First)
	hi, ok2 := s.u.offset(r.Last)
	if !ok1 || !ok2 || hi.Less(lo) {
		return netip.Addr{}, fmt.Errorf("%w: range %v", ErrOutside, r)
	}
	return s.allocate(lo, hi, r.String())
}

// IsFree reports whether a is owned and free.
func (s *space) IsFree(a netip.Addr) bool {
	x, ok := s.u.offset(a)
	if !ok {
		return false
	}
	i := s.freeAt(x)
	return i < len(s.free) && !x.Less(s.free[i].lo)
}

// MarshalBinary is Encode, for encoding.BinaryMarshaler.
func (r *Ring) MarshalBinary() ([]byte, error) { return r.Encode(), nil }

// unmarshalBinary is Decode into r, for encoding.BinaryUnmarshaler.
func (r *Ring) unmarshalBinary(b []byte) error {
	d, err := Decode(b)
	if err != nil {
		return err
	}
	*r = *d
	return nil
}
