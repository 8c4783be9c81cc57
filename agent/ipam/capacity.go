package ipam

import (
	"github.com/carve-net/carve/agent/ipam/capacity"
)

// readCapacity reads every served overlay's use (package capacity's
// gauges and low-space warning).
func (s *Service) readCapacity() []capacity.Overlay {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []capacity.Overlay
	for _, name := range sortedKeys(s.overlays) {
		o := s.overlays[name]
		if o.unserved != "" {
			continue
		}
		oc := capacity.Overlay{Name: name}
		for fam := range families {
			if o.alloc[fam] == nil {
				continue
			}
			for kind := range o.bridges {
				if len(o.bridgeBlocks(kind, fam)) > 0 {
					oc.Has[fam] = true
					oc.Free[fam] = satAdd(oc.Free[fam], o.freeHosts(kind, fam))
				}
			}
			for _, rec := range o.attached {
				if rec.addr(fam).IsValid() {
					oc.Used[fam]++
				}
			}
		}
		out = append(out, oc)
	}
	return out
}
