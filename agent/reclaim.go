package agent

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// DefaultCNICacheDir is where libcni-based runtimes cache ADD results.
const DefaultCNICacheDir = "/var/lib/cni"

// cniCacheEntry is the part of libcni's cached ADD result carve reads.
type cniCacheEntry struct {
	ContainerID string `json:"containerId"`
	IfName      string `json:"ifName"`
	NetworkName string `json:"networkName"`
	Result      struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	} `json:"result"`
}

// reclaimFromCNICache claims the addresses that a CNI runtime's cache says
// live containers hold on this overlay and that the agent does not know:
// an agent that lost its disk takes them back before handing out any new
// address. libcni keeps a result until the container's DEL succeeds, so a
// stale entry means a DEL still to come (or a GC), never a reused address.
// The caller holds s.mu.
func (s *IPAM) reclaimFromCNICache(o *overlayIPAM) {
	dir := s.a.cfg.CNICacheDir
	if dir == "" {
		return
	}
	files, err := os.ReadDir(filepath.Join(dir, "results"))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("read the CNI cache", "dir", dir, "err", err)
		}
		return
	}
	subnets := o.bridges[api.BridgeMesos]
	claimed := 0
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, "results", f.Name()))
		if err != nil {
			continue
		}
		var e cniCacheEntry
		if json.Unmarshal(data, &e) != nil || e.NetworkName != o.name || e.ContainerID == "" || e.IfName == "" {
			continue
		}
		at := ring.Attachment{ContainerID: e.ContainerID, Interface: e.IfName}
		if _, known := o.attached[at]; known {
			continue
		}
		rec := allocRecord{Bridge: api.BridgeMesos}
		for _, ip := range e.Result.IPs {
			p, err := netip.ParsePrefix(ip.Address)
			if err != nil {
				continue
			}
			addr := p.Addr()
			switch {
			case addr.Is4() && o.alloc4 != nil && subnets[0].Contains(addr) && o.alloc4.Claim(at, addr) == nil:
				rec.V4 = addr
			case addr.Is6() && o.alloc6 != nil && subnets[1].Contains(addr) && o.alloc6.Claim(at, addr) == nil:
				rec.V6 = addr
			}
		}
		if !rec.V4.IsValid() && !rec.V6.IsValid() {
			continue
		}
		if err := s.save(o.name, at, &rec); err != nil {
			s.log.Error("persist a reclaimed address", "container", at.ContainerID, "err", err)
			s.releaseMem(o, at)
			continue
		}
		o.attached[at] = rec
		claimed++
	}
	if claimed > 0 {
		s.log.Warn("reclaimed addresses of running containers from the CNI cache", "overlay", o.name, "count", claimed, "dir", dir)
	}
}
