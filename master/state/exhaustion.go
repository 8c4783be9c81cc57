package state

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/carve-net/carve/api"
)

// maxNamedUnleased bounds the agents an exhausted overlay names (the count
// is whole).
const maxNamedUnleased = 10

// Exhausted lists the enabled overlays, by address family, that cannot
// give an agent or a container what it asks for: agents left without a
// subnet (every subnet is leased), or no block left to grow into while the
// agents' usage reports count no free address (only the leader receives
// usage reports; elsewhere Full is never judged). Sorted by overlay, then
// family.
func (t *LeaseTable) Exhausted() []api.ExhaustedOverlay {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.net == nil {
		return nil
	}
	var out []api.ExhaustedOverlay
	for def := range t.net.Overlays() {
		if !def.Enabled() {
			continue
		}
		for _, fam := range []struct {
			is4    bool
			subnet netip.Prefix
		}{{true, def.Subnet()}, {false, def.Subnet6()}} {
			space := t.spaces[def.Name()].family(fam.is4)
			if space == nil || !fam.subnet.IsValid() {
				continue
			}
			ex := api.ExhaustedOverlay{Overlay: def.Name(), Family: 6}
			if fam.is4 {
				ex.Family = 4
			}
			for _, rec := range t.agents {
				if l := rec.Leases[def.Name()]; strings.Contains(l.Failed, "exhausted: no free /") && strings.Contains(l.Failed, " in "+fam.subnet.String()) {
					ex.UnleasedCount++
					ex.Unleased = append(ex.Unleased, rec.ID)
				}
			}
			slices.Sort(ex.Unleased)
			if len(ex.Unleased) > maxNamedUnleased {
				ex.Unleased = ex.Unleased[:maxNamedUnleased]
			}
			if _, growable := space.FirstFree(def.GrowBits(fam.is4)); !growable {
				ex.Free, ex.Full = t.usage.FreeIn(def.Name(), fam.is4, t.leasedAgents(def.Name(), fam.is4))
			}
			if ex.UnleasedCount > 0 || ex.Full {
				out = append(out, ex)
			}
		}
	}
	slices.SortFunc(out, func(a, b api.ExhaustedOverlay) int {
		if c := strings.Compare(a.Overlay, b.Overlay); c != 0 {
			return c
		}
		return a.Family - b.Family
	})
	return out
}

// leasedAgents maps the agents that hold blocks of the overlay's family to
// the Created index of their record (t.mu held).
func (t *LeaseTable) leasedAgents(overlay string, is4 bool) map[string]uint64 {
	out := map[string]uint64{}
	for id, rec := range t.agents {
		for _, b := range rec.Leases[overlay].Blocks {
			if b.Prefix.Addr().Is4() == is4 {
				out[id] = rec.Created
				break
			}
		}
	}
	return out
}
