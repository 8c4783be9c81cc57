package ipam

import (
	"github.com/carve-net/carve/agent/ipam/capacity"
	"github.com/carve-net/carve/agent/ipam/overlayspace"
)

// readCapacity reads every served overlay's use (package capacity's
// gauges and low-space warning).
func (s *Service) readCapacity() []capacity.Overlay {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []capacity.Overlay
	for _, name := range sortedKeys(s.overlays) {
		o := s.overlays[name]
		if o.Unserved != "" {
			continue
		}
		oc := capacity.Overlay{Name: name}
		for fam := range families {
			if o.Alloc[fam] == nil {
				continue
			}
			for kind := range o.Bridges {
				if len(o.BridgeBlocks(kind, fam)) > 0 {
					oc.Has[fam] = true
					oc.Free[fam] = overlayspace.SatAdd(oc.Free[fam], o.FreeHosts(kind, fam))
				}
			}
			for _, rec := range o.Attached {
				if rec.Addr(fam).IsValid() {
					oc.Used[fam]++
				}
			}
		}
		out = append(out, oc)
	}
	return out
}
