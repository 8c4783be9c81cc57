package state

import (
	"fmt"
	"net/netip"

	"github.com/carve-net/carve/prefixspace"
)

// blockSpace is the aligned-block allocator of one overlay family: the
// non-overlapping CIDR prefixes of the overlay subnet that are held, each
// with its holder, and the lowest free aligned block of a size (first
// fit). An agent's first lease is a whole free prefix-sized slice; grown
// blocks are smaller and may use what is left of a slice. The arithmetic
// is prefixspace's.
type blockSpace = prefixspace.Space[blockHolder]

// slicePool hands out the hosts of the VTEP subnet, first fit.
type slicePool = prefixspace.Pool

// blockHolder is who holds a block: an agent, or for the quarantined space
// of a deleted agent, that agent.
type blockHolder struct {
	id          string
	quarantined bool
}

// String names a holder in messages (a blockSpace's overlap errors).
func (h blockHolder) String() string {
	if h.quarantined {
		return fmt.Sprintf("deleted agent %q (quarantined)", h.id)
	}
	return fmt.Sprintf("agent %q", h.id)
}

// agentHolds is agent id's own (not quarantined) hold on a block.
func agentHolds(id string) blockHolder { return blockHolder{id: id} }

// quarantineHolds is the hold of a deleted agent's quarantined space.
func quarantineHolds(id string) blockHolder { return blockHolder{id: id, quarantined: true} }

func newBlockSpace(universe netip.Prefix) *blockSpace {
	return prefixspace.NewSpace[blockHolder](universe)
}

// newHostPool is the pool of host addresses of a VTEP subnet, without its
// network and broadcast addresses.
func newHostPool(base netip.Prefix) *slicePool { return prefixspace.NewHostPool(base) }
