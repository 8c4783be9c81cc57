package state

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
)

// ownedPrefix is one held block and who holds it.
type ownedPrefix struct {
	p           netip.Prefix
	holder      string
	quarantined bool
}

// CheckInvariants checks the table's invariants and says which one broke:
// every agent's blocks lie inside its overlay and are CIDR-aligned; no two
// agents' blocks overlap, nor a block and a quarantined one; the
// allocators hold exactly the blocks of the records and the quarantine;
// and what they would hand out next is free. The property and cluster
// tests run it after every step.
func (tb *LeaseTable) CheckInvariants() error {
	tb.mu.RLock()
	defer tb.mu.RUnlock()
	for name, sp := range tb.spaces {
		for _, space := range []*blockSpace{sp.v4, sp.v6} {
			if space == nil {
				continue
			}
			var want []ownedPrefix
			for id, rec := range tb.agents {
				for _, b := range rec.Leases[name].Blocks {
					if b.Prefix.Addr().Is4() != space.universe.Addr().Is4() {
						continue
					}
					if !space.universe.Contains(b.Prefix.Addr()) || b.Prefix.Bits() < space.universe.Bits() {
						return fmt.Errorf("agent %s's block %s is outside overlay %s (%s)", id, b.Prefix, name, space.universe)
					}
					if b.Prefix.Masked() != b.Prefix {
						return fmt.Errorf("agent %s's block %s is not CIDR-aligned", id, b.Prefix)
					}
					want = append(want, ownedPrefix{b.Prefix, id, false})
				}
			}
			for _, q := range tb.quarantine[name] {
				if q.Prefix.Addr().Is4() == space.universe.Addr().Is4() {
					want = append(want, ownedPrefix{q.Prefix, q.From, true})
				}
			}
			sort.Slice(want, func(i, j int) bool { return want[i].p.Addr().Less(want[j].p.Addr()) })
			for i := 1; i < len(want); i++ {
				if want[i-1].p.Overlaps(want[i].p) {
					return fmt.Errorf("overlay %s: %s of %s (quarantined %v) overlaps %s of %s (quarantined %v)", name,
						want[i-1].p, want[i-1].holder, want[i-1].quarantined, want[i].p, want[i].holder, want[i].quarantined)
				}
			}
			var got []ownedPrefix
			for _, h := range space.held {
				got = append(got, ownedPrefix{h.prefix, h.holder, h.quarantined})
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("overlay %s: the allocator holds %v, the records and quarantine %v", name, got, want)
			}
			for _, f := range space.freeSpans() {
				for _, h := range space.held {
					if !(f[1].Less(h.first) || h.last.Less(f[0])) {
						return fmt.Errorf("overlay %s: free span %v-%v overlaps %s", name, f[0], f[1], h.prefix)
					}
				}
			}
			for bits := space.universe.Bits(); bits <= min(space.universe.Bits()+8, space.universe.Addr().BitLen()); bits++ {
				if p, ok := space.firstFree(bits); ok {
					if len(space.overlapping(p)) > 0 {
						return fmt.Errorf("overlay %s: firstFree(/%d) = %s, which is held", name, bits, p)
					}
				}
			}
		}
	}
	return nil
}
