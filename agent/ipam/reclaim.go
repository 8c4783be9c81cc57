package ipam

import (
	"net/netip"
	"time"

	"github.com/carve-net/carve/agent/ipam/cnihost"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// reclaimFromCNICache claims the addresses that a CNI runtime's cache says
// live containers hold on this overlay and that the agent does not know:
// an agent that lost its disk takes them back before handing out any new
// address. libcni keeps a result until the container's DEL succeeds, so a
// stale entry means a DEL still to come (or a GC), never a reused address,
// unless this agent released the attachment lately: then the DEL may be
// done but for libcni's cleanup, and the entry is skipped (s.released).
// The claims are queued with add; the caller holds s.mu.
func (s *Service) reclaimFromCNICache(o *overlay, add func(change)) {
	dir := s.cniCacheDir
	if dir == "" {
		return
	}
	results, err := cnihost.ReadResults(dir, o.Name)
	if err != nil {
		s.log.Warn("read the CNI cache", "dir", dir, "err", err)
		return
	}
	inBridge := func(addr netip.Addr) bool {
		for _, p := range o.BridgeBlocks(api.BridgeMesos, ipfamily.Of(addr)) {
			if p.Contains(addr) {
				return true
			}
		}
		return false
	}
	claimed := 0
	now := time.Now()
	for _, e := range results {
		at := ring.Attachment{ContainerID: e.ContainerID, Interface: e.IfName}
		if _, known := o.Attached[at]; known || s.released.released(allocKey(o.Name, at), now) {
			continue
		}
		rec := allocRecord{Bridge: api.BridgeMesos, Owner: e.Owner}
		for _, addr := range e.Addrs {
			fam := ipfamily.Of(addr)
			if o.Alloc[fam] != nil && !rec.Addr(fam).IsValid() && inBridge(addr) && o.Alloc[fam].Claim(at, addr) == nil {
				rec.SetAddr(fam, addr)
			}
		}
		if rec.Empty() {
			continue
		}
		o.Attached[at] = rec
		add(change{Key: allocKey(o.Name, at), Writes: []write{putAlloc(o.Name, at, rec)}, Undo: func() { forget(o, at) },
			Durable: func() { s.metrics.Ops.WithLabelValues("reclaim").Inc() }})
		claimed++
	}
	if claimed > 0 {
		s.log.Warn("reclaimed addresses of running containers from the CNI cache", "overlay", o.Name, "count", claimed, "dir", dir)
	}
}
