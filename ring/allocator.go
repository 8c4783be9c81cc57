package ring

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Attachment names who holds an address: one interface of one container.
// Allocation is idempotent by attachment.
type Attachment struct {
	ContainerID string
	Interface   string
}

// Allocation is an address held by an attachment.
type Allocation struct {
	Attachment
	Addr netip.Addr
}

// Allocator is one peer's view of one overlay: the ring, the space of the
// ranges the ring says the peer owns, and the addresses handed out. After
// every operation the ranges the ring gives the peer equal those the space
// holds. Not safe for concurrent use; deterministic (no randomness, no map
// order leaks into results).
type Allocator struct {
	self     string
	ring     *Ring
	space    *space
	byAttach map[Attachment]netip.Addr
	byAddr   map[netip.Addr]Attachment
	reserved map[netip.Addr]bool
	// isolated are the attachments whose address the masters' records
	// took from this peer (SeedSetsIsolating): bound, not in the space.
	isolated map[Attachment]bool
	// last is, per subnet Allocate was asked for, the address it handed
	// out last there: the next allocation starts after it (round-robin).
	// Local to this peer and this process: never gossiped, never
	// persisted (a new allocator resumes after the highest address in use).
	last map[netip.Prefix]netip.Addr
}

// NewAllocator returns the allocator of peer self (its agent id) over an
// empty ring of the universe.
func NewAllocator(self string, universe netip.Prefix) (*Allocator, error) {
	if self == "" {
		return nil, fmt.Errorf("%w: empty peer id", ErrInvalid)
	}
	r, err := NewRing(universe)
	if err != nil {
		return nil, err
	}
	s, _ := newSpace(universe) // same universe, already validated
	return &Allocator{
		self: self, ring: r, space: s,
		byAttach: map[Attachment]netip.Addr{},
		byAddr:   map[netip.Addr]Attachment{},
		reserved: map[netip.Addr]bool{},
		last:     map[netip.Prefix]netip.Addr{},
	}, nil
}

// Self is the peer this allocator acts for.
func (a *Allocator) Self() string { return a.self }

// Ring returns a copy of the ring, for queries; changes go through the
// allocator so that the space follows.
func (a *Allocator) Ring() *Ring { return a.ring.Clone() }

// RingChanges is Ring().Changes() without the copy.
func (a *Allocator) RingChanges() uint64 { return a.ring.Changes() }

// EncodeRing is Ring().Encode() without the copy.
func (a *Allocator) EncodeRing() []byte { return a.ring.Encode() }

// Owned returns the ranges this peer owns.
func (a *Allocator) Owned() []Range { return a.space.Owned() }

// FreeCount is the number of free addresses this peer has.
func (a *Allocator) FreeCount() Uint128 { return a.space.FreeCount() }

func (a *Allocator) inUse(r Range) bool { return a.space.InUse(r) }

// apply swaps in a new ring state after checking that it takes no range in
// use from this peer, and makes the space follow.
func (a *Allocator) apply(next state) error {
	if err := takeover(a.ring.u, a.ring.st.view, next.view, a.self, a.inUse); err != nil {
		return err
	}
	if err := a.space.setOwned(ownedIvals(a.ring.u, next.view, a.self)); err != nil {
		var te *TakeoverError
		if errors.As(err, &te) {
			te.Peer = a.self
		}
		return err
	}
	a.ring.commit(next)
	a.reclaimIsolated()
	return nil
}

// reclaimIsolated takes back, in use, the address of every isolated
// allocation that the space owns again (the masters' records gave the
// range back: a restore, a grant recorded again): its attachment still
// holds it, and a regained range comes back free, so that the next
// allocation there would hand the address out a second time. It is an
// allocation of this peer's like any other again.
func (a *Allocator) reclaimIsolated() {
	for at := range a.isolated {
		if a.space.Claim(a.byAttach[at]) == nil {
			delete(a.isolated, at)
		}
	}
}

// Seed joins the master's lease table and tombstones into the ring (see
// Ring.Seed). A table that would take from this peer a range where it has
// allocations is refused with a *TakeoverError.
func (a *Allocator) Seed(leases []Lease, tombstones []Tombstone) (changed bool, err error) {
	next, changed, err := a.ring.trySeed(leases, nil, tombstones)
	if err != nil || !changed {
		return false, err
	}
	if err := a.apply(next); err != nil {
		return false, err
	}
	return true, nil
}

// SeedSets joins complete lease sets and tombstones into the ring (see
// Ring.SeedSets), refusing like Seed a change that takes a range in use.
func (a *Allocator) SeedSets(sets []LeaseSet, tombstones []Tombstone) (changed bool, err error) {
	leases, floors := flattenSets(a.ring.newerSets(sets))
	next, changed, err := a.ring.trySeed(leases, floors, tombstones)
	if err != nil || !changed {
		return false, err
	}
	if err := a.apply(next); err != nil {
		return false, err
	}
	return true, nil
}

// ReleaseBlock gives p, which must lie inside ranges of this peer in its
// leases and hold no address in use, back to nobody (see Ring.Release).
func (a *Allocator) ReleaseBlock(p netip.Prefix) error {
	start, end, err := a.ring.u.prefixSpan(p)
	if err != nil {
		return err
	}
	if a.inUse(a.ring.u.rangeOf(start, end.dec())) {
		return fmt.Errorf("%w: %v holds addresses in use", ErrAddressInUse, p)
	}
	next, err := a.ring.tryGive(a.self, "", p)
	if err != nil {
		return err
	}
	if err := a.apply(next); err != nil {
		return err
	}
	a.forgetLast(p)
	_, err = a.SyncFree()
	return err
}

// Merge joins a remote ring into this peer's ring. It never accepts a change
// that takes away a range where this peer has allocations: it returns a
// *TakeoverError and leaves everything as it was. An invalid ring or one of
// another universe is refused likewise.
func (a *Allocator) Merge(remote *Ring) (changed bool, err error) {
	next, changed, err := a.ring.tryMerge(remote)
	if err != nil || !changed {
		return false, err
	}
	if err := a.apply(next); err != nil {
		return false, err
	}
	return true, nil
}

// MergeEncoded decodes a ring and merges it.
func (a *Allocator) MergeEncoded(b []byte) (changed bool, err error) {
	remote, err := Decode(b)
	if err != nil {
		return false, err
	}
	return a.Merge(remote)
}

// Grant gives the CIDR-aligned prefix p, which must lie inside ranges of
// this peer in its leases and hold no address in use, to peer to (see
// Ring.Grant).
func (a *Allocator) Grant(to string, p netip.Prefix) error {
	start, end, err := a.ring.u.prefixSpan(p)
	if err != nil {
		return err
	}
	if a.inUse(a.ring.u.rangeOf(start, end.dec())) {
		return fmt.Errorf("%w: %v holds addresses in use", ErrAddressInUse, p)
	}
	next, err := a.ring.tryGrant(a.self, to, p)
	if err != nil {
		return err
	}
	if err := a.apply(next); err != nil {
		return err
	}
	a.forgetLast(p)
	_, err = a.SyncFree()
	return err
}

// DonateBlock grants peer to the highest free CIDR-aligned block of
// 2^log2 addresses inside one of the within prefixes and one of this
// peer's ranges: the donor's half of a space request. Reserved addresses (a
// bridge's gateway) are not free, so no block holding one is given.
func (a *Allocator) DonateBlock(to string, within []netip.Prefix, log2 int) (netip.Prefix, error) {
	p, ok := a.space.FreeBlock(within, log2)
	if !ok {
		return netip.Prefix{}, ErrNothingToDonate
	}
	if err := a.Grant(to, p); err != nil {
		return netip.Prefix{}, err
	}
	return p, nil
}

// FreeHosts counts the free addresses of subnet that Allocate may hand out.
func (a *Allocator) FreeHosts(subnet netip.Prefix) Uint128 { return a.space.FreeHosts(subnet) }

// SyncFree writes the space's free counts into the ring's tokens. Cheap when
// nothing changed; a holder calls it before gossiping rather than on every
// allocation, so that allocations do not flood the network.
func (a *Allocator) SyncFree() (changed bool, err error) {
	next, changed, err := a.ring.tryReportFree(a.self, a.space.FreeByRange())
	if err != nil || !changed {
		return false, err
	}
	a.ring.commit(next) // same owners, same ranges: nothing to check
	return true, nil
}

// Holder returns the attachment holding addr.
func (a *Allocator) Holder(addr netip.Addr) (Attachment, bool) {
	at, ok := a.byAddr[addr]
	return at, ok
}

// Allocate gives an attachment the first free address of subnet after the
// one it handed out last there, wrapping to the subnet's first host (never
// the subnet's network, gateway or broadcast address). A second call for the
// same attachment returns the address it already holds.
//
// Round-robin, as CNI's host-local does, rather than the lowest free: an
// address freed now is handed out again only after the allocator went once
// around the subnet, so a container that gets it does not meet the old
// container's MAC in a neighbour cache (the host's entry on the bridge stays
// REACHABLE for up to 45 s; see docs/design.md, "Allocation order"). Only a
// subnet with no other free address gives it back at once. Until its first
// allocation in a subnet (a new allocator, or after a restart) it starts
// after the highest address in use there.
func (a *Allocator) Allocate(at Attachment, subnet netip.Prefix) (netip.Addr, error) {
	if addr, ok := a.byAttach[at]; ok {
		return addr, nil
	}
	addr, err := a.space.AllocateAfter(subnet, a.last[subnet])
	if err != nil {
		return netip.Addr{}, err
	}
	a.last[subnet] = addr
	a.bind(at, addr)
	return addr, nil
}

// forgetLast drops the round-robin position of the subnets inside p, which
// this peer gives away: a subnet it gets back starts afresh.
func (a *Allocator) forgetLast(p netip.Prefix) {
	for subnet := range a.last {
		if p.Bits() <= subnet.Bits() && p.Contains(subnet.Addr()) {
			delete(a.last, subnet)
		}
	}
}

func (a *Allocator) bind(at Attachment, addr netip.Addr) {
	a.byAttach[at] = addr
	a.byAddr[addr] = at
}

// Claim gives an attachment a specific address, as when a restarted agent
// takes back the addresses its running containers still use. Claiming the
// address an attachment already holds is a no-op.
func (a *Allocator) Claim(at Attachment, addr netip.Addr) error {
	if cur, ok := a.byAttach[at]; ok {
		if cur == addr {
			return nil
		}
		return fmt.Errorf("%w: %v holds %v", ErrAttachmentBound, at, cur)
	}
	if other, ok := a.byAddr[addr]; ok {
		return fmt.Errorf("%w: %v is held by %v", ErrAddressInUse, addr, other)
	}
	if err := a.space.Claim(addr); err != nil {
		return err
	}
	a.bind(at, addr)
	return nil
}

// Release frees the address of an attachment; ok is false if it held none.
func (a *Allocator) Release(at Attachment) (addr netip.Addr, ok bool) {
	addr, ok = a.byAttach[at]
	if !ok {
		return netip.Addr{}, false
	}
	a.unbind(Allocation{at, addr})
	return addr, true
}

func (a *Allocator) unbind(al Allocation) {
	delete(a.byAttach, al.Attachment)
	delete(a.byAddr, al.Addr)
	if a.isolated[al.Attachment] {
		delete(a.isolated, al.Attachment) // not in the space: nothing to free
		return
	}
	// The address is in use in the space by construction; a failure
	// here would be a bug, and freeing nothing is the safe side.
	_ = a.space.Release(al.Addr)
}

// Reserve takes an owned address out of circulation without an attachment
// (a bridge's gateway, say), so that it is neither allocated nor donated.
// Reserving a reserved address is a no-op.
func (a *Allocator) Reserve(addr netip.Addr) error {
	if a.reserved[addr] {
		return nil
	}
	if at, ok := a.byAddr[addr]; ok {
		return fmt.Errorf("%w: %v is held by %v", ErrAddressInUse, addr, at)
	}
	if err := a.space.Claim(addr); err != nil {
		return err
	}
	a.reserved[addr] = true
	return nil
}

// Unreserve returns a reserved address to the free space.
func (a *Allocator) Unreserve(addr netip.Addr) {
	if a.reserved[addr] {
		delete(a.reserved, addr)
		_ = a.space.Release(addr)
	}
}

// Reserved returns the reserved addresses in order.
func (a *Allocator) Reserved() []netip.Addr {
	out := make([]netip.Addr, 0, len(a.reserved))
	for addr := range a.reserved {
		out = append(out, addr)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
