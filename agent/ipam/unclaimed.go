package ipam

import (
	"net/netip"

	"github.com/carve-net/carve/api"
)

// Unclaimed returns the allocations of a network (every network when
// empty) that the agent loaded from its store but could not claim back:
// their overlay is not served, or its rings give the address to another
// agent, as after a restored or cloned data dir, or a lease taken away. The
// agent keeps such a record (its container may still use the address) and
// allocates nothing for it, but no other list shows it: an operator's check
// needs it to see an address two agents hold. Addresses are given as single
// hosts (/32, /128), since the bridge's range is not known for them.
func (s *Service) Unclaimed(network string) []api.Allocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []api.Allocation{}
	for _, name := range sortedKeys(s.persist) {
		if network != "" && name != network {
			continue
		}
		for _, at := range sortedAttachments(s.persist[name]) {
			rec := s.persist[name][at]
			al := api.Allocation{Network: name, ContainerID: at.ContainerID, IfName: at.Interface, Bridge: rec.Bridge, Owner: rec.Owner}
			for fam := range families {
				if addr := rec.Addr(fam); addr.IsValid() {
					al.IPs = append(al.IPs, api.IPConfig{Address: netip.PrefixFrom(addr, addr.BitLen()).String()})
				}
			}
			out = append(out, al)
		}
	}
	return out
}
