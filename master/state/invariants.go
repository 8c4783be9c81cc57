package state

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/carve-net/carve/prefixspace"
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
// and what they would hand out next is free; and the key index lists
// every agent's keys. The property and cluster tests run it after every
// step.
func (tb *LeaseTable) CheckInvariants() error {
	tb.mu.RLock()
	defer tb.mu.RUnlock()
	if err := tb.checkKeyIndex(); err != nil {
		return err
	}
	for name, sp := range tb.spaces {
		for _, space := range []*blockSpace{sp.v4, sp.v6} {
			if space == nil {
				continue
			}
			u := space.Universe()
			var want []ownedPrefix
			for id, rec := range tb.agents {
				for _, b := range rec.Leases[name].Blocks {
					if b.Prefix.Addr().Is4() != u.Addr().Is4() {
						continue
					}
					if !prefixspace.Contains(u, b.Prefix) {
						return fmt.Errorf("agent %s's block %s is outside overlay %s (%s)", id, b.Prefix, name, u)
					}
					if b.Prefix.Masked() != b.Prefix {
						return fmt.Errorf("agent %s's block %s is not CIDR-aligned", id, b.Prefix)
					}
					want = append(want, ownedPrefix{b.Prefix, id, false})
				}
			}
			for _, q := range tb.quarantine[name] {
				if q.Prefix.Addr().Is4() == u.Addr().Is4() {
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
			for _, h := range space.Blocks() {
				got = append(got, ownedPrefix{h.Prefix, h.Holder.id, h.Holder.quarantined})
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("overlay %s: the allocator holds %v, the records and quarantine %v", name, got, want)
			}
			for _, f := range space.FreeSpans() {
				for _, h := range space.Blocks() {
					if f.Overlaps(h.Span) {
						return fmt.Errorf("overlay %s: free span %v-%v overlaps %s", name, f.First, f.Last, h.Prefix)
					}
				}
			}
			for bits := u.Bits(); bits <= min(u.Bits()+8, u.Addr().BitLen()); bits++ {
				if p, ok := space.FirstFree(bits); ok {
					if len(space.Overlapping(p)) > 0 {
						return fmt.Errorf("overlay %s: firstFree(/%d) = %s, which is held", name, bits, p)
					}
				}
			}
		}
	}
	return nil
}
