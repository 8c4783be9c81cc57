package ring

import (
	"errors"
	"net/netip"
	"slices"
)

// SeedSetsIsolating is SeedSets for the masters' records, the one authority
// on who leases what. Where they take from this peer a range in which it
// has allocations, it does not refuse the records (a refusal would leave
// the peer's whole view behind the masters', and every allocation of the
// overlay failing): it takes them, and isolates exactly the allocations in
// the ranges taken. An isolated allocation keeps its attachment and its
// address (the container keeps running with it, and releasing it works),
// but the address is no longer this peer's to hand out or donate: the
// space does not own it. Addresses reserved there (gateways) are let go.
// isolated lists the allocations isolated by this call, in address order.
func (a *Allocator) SeedSetsIsolating(sets []LeaseSet, tombstones []Tombstone) (changed bool, isolated []Allocation, err error) {
	leases, floors := flattenSets(a.ring.newerSets(sets))
	next, changed, err := a.ring.trySeed(leases, floors, tombstones)
	if err != nil || !changed {
		return false, nil, err
	}
	err = a.apply(next)
	var te *TakeoverError
	if err == nil || !errors.As(err, &te) {
		return err == nil, nil, err
	}
	owned := ownedIvals(a.ring.u, next.view, a.self)
	inside := func(addr netip.Addr) bool {
		x, ok := a.ring.u.offset(addr)
		if !ok {
			return false
		}
		for _, v := range owned {
			if !x.Less(v.lo) && !v.hi.Less(x) {
				return true
			}
		}
		return false
	}
	addrs := make([]netip.Addr, 0, len(a.byAddr))
	for addr := range a.byAddr {
		if !a.isolated[a.byAddr[addr]] && !inside(addr) {
			addrs = append(addrs, addr)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	for _, addr := range addrs {
		at := a.byAddr[addr]
		if a.isolated == nil {
			a.isolated = map[Attachment]bool{}
		}
		a.isolated[at] = true
		_ = a.space.Release(addr) // in use in the space by construction
		isolated = append(isolated, Allocation{Attachment: at, Addr: addr})
	}
	for _, addr := range a.Reserved() {
		if !inside(addr) {
			a.Unreserve(addr)
		}
	}
	if err := a.apply(next); err != nil {
		return false, isolated, err
	}
	return true, isolated, nil
}

// Isolated returns the allocations whose address the masters' records took
// from this peer (SeedSetsIsolating), in address order: held still,
// released when their attachment leaves, never handed out again here. One
// whose range the records give back is in use in the space again, and no
// longer isolated (Allocator.apply).
func (a *Allocator) Isolated() []Allocation {
	var out []Allocation
	for at := range a.isolated {
		out = append(out, Allocation{Attachment: at, Addr: a.byAttach[at]})
	}
	slices.SortFunc(out, func(x, y Allocation) int { return x.Addr.Compare(y.Addr) })
	return out
}
