package ring

import (
	"errors"
	"fmt"
)

// Sentinel errors, for callers that branch with errors.Is.
var (
	// ErrInvalid marks a ring, lease or encoding that breaks a rule
	// (unsorted, repeated, out of range, impossible free count, ...).
	ErrInvalid = errors.New("ring: invalid")
	// ErrOtherUniverse marks a ring of another universe than the local one.
	ErrOtherUniverse = errors.New("ring: other universe")
	// ErrOutside marks an address or prefix outside the universe or its family.
	ErrOutside = errors.New("ring: outside the universe")
	// ErrNotAligned marks a prefix with host bits set.
	ErrNotAligned = errors.New("ring: prefix not aligned")
	// ErrNotOwner marks an operation on a range the acting peer does not own.
	ErrNotOwner = errors.New("ring: range not owned")
	// ErrNotLessee marks a write where the acting peer owns the range but
	// does not lease it (a grant the masters have not recorded yet): only
	// the lessee's tokens count.
	ErrNotLessee = errors.New("ring: range not leased by the writer")
	// ErrDeparted marks a grant or transfer to a peer the ring has a tombstone for.
	ErrDeparted = errors.New("ring: peer departed")
	// ErrVersionExhausted marks a token whose local counter cannot grow
	// without crossing into the next Raft epoch.
	ErrVersionExhausted = errors.New("ring: version counter exhausted")
	// ErrFull marks an allocation with no free address left where it was asked.
	ErrFull = errors.New("ring: no free address")
	// ErrNotOwned marks an address outside the ranges this peer owns.
	ErrNotOwned = errors.New("ring: address not owned by this peer")
	// ErrAddressInUse marks a claim of an address that is already taken.
	ErrAddressInUse = errors.New("ring: address in use")
	// ErrNotAllocated marks a release of an address that is free.
	ErrNotAllocated = errors.New("ring: address not allocated")
	// ErrAttachmentBound marks a claim for an attachment that already holds
	// another address.
	ErrAttachmentBound = errors.New("ring: attachment holds another address")
	// ErrNothingToDonate marks a donation asked of a peer without a free block.
	ErrNothingToDonate = errors.New("ring: nothing to donate")
)

// TakeoverError is returned when a change (a merge, a seed) would take away
// from Peer a range in which it has allocations. The change is refused as a
// whole and the local state is left as it was: accepting it would hand the
// same addresses to two peers.
type TakeoverError struct {
	Peer     string // the peer that would lose the range (this peer)
	Range    Range  // the part that would be taken
	NewOwner string // who would own it instead ("" for nobody)
}

// Error names the range and who would take it.
func (e *TakeoverError) Error() string {
	owner := e.NewOwner
	if owner == "" {
		owner = "no owner"
	}
	return fmt.Sprintf("ring: change would give %v, where %s has allocations, to %s", e.Range, e.Peer, owner)
}
