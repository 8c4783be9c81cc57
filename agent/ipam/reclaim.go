package ipam

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// cniCacheEntry is the part of libcni's cached ADD result carve reads.
type cniCacheEntry struct {
	ContainerID string `json:"containerId"`
	IfName      string `json:"ifName"`
	NetworkName string `json:"networkName"`
	NetNS       string `json:"netns"`
	// CNIArgs are the CNI_ARGS pairs of the ADD ([[key, value], ...]).
	CNIArgs [][2]string `json:"cniArgs"`
	Result  struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	} `json:"result"`
}

// owner is the entry's container as its ADD named it, so that the
// netns reclaim (netnsreclaim.go) lets the address go once the namespace
// is gone. Identity pairs that do not parse are left out.
func (e cniCacheEntry) owner() *api.Owner {
	pairs := make([]string, 0, len(e.CNIArgs))
	for _, kv := range e.CNIArgs {
		pairs = append(pairs, kv[0]+"="+kv[1])
	}
	args, err := api.ParseCNIArgs(strings.Join(pairs, ";"))
	if err != nil {
		args = api.CNIArgs{}
	}
	o := args.Owner
	o.Runtime, o.ContainerID, o.IfName, o.NetNS = api.RuntimeCNI, e.ContainerID, e.IfName, e.NetNS
	if o.Validate() != nil {
		return &api.Owner{Runtime: api.RuntimeCNI, ContainerID: e.ContainerID, IfName: e.IfName}
	}
	return &o
}

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
	files, err := os.ReadDir(filepath.Join(dir, "results"))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("read the CNI cache", "dir", dir, "err", err)
		}
		return
	}
	inBridge := func(addr netip.Addr) bool {
		for _, p := range o.bridgeBlocks(api.BridgeMesos, familyOf(addr)) {
			if p.Contains(addr) {
				return true
			}
		}
		return false
	}
	claimed := 0
	now := time.Now()
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, "results", f.Name()))
		if err != nil {
			continue
		}
		var e cniCacheEntry
		if json.Unmarshal(data, &e) != nil || e.NetworkName != o.name ||
			api.ValidateContainerID(e.ContainerID) != nil || api.ValidateIfName(e.IfName) != nil {
			continue
		}
		at := ring.Attachment{ContainerID: e.ContainerID, Interface: e.IfName}
		if _, known := o.attached[at]; known || s.released.released(allocKey(o.name, at), now) {
			continue
		}
		rec := allocRecord{Bridge: api.BridgeMesos, Owner: e.owner()}
		for _, ip := range e.Result.IPs {
			p, err := netip.ParsePrefix(ip.Address)
			if err != nil {
				continue
			}
			addr := p.Addr()
			fam := 0
			if addr.Is6() {
				fam = 1
			}
			if o.alloc[fam] != nil && !rec.addr(fam).IsValid() && inBridge(addr) && o.alloc[fam].Claim(at, addr) == nil {
				rec.setAddr(fam, addr)
			}
		}
		if rec.empty() {
			continue
		}
		o.attached[at] = rec
		add(change{key: allocKey(o.name, at), writes: []write{putAlloc(o.name, at, rec)}, undo: func() { forget(o, at) },
			durable: func() { s.metrics.ops.WithLabelValues("reclaim").Inc() }})
		claimed++
	}
	if claimed > 0 {
		s.log.Warn("reclaimed addresses of running containers from the CNI cache", "overlay", o.name, "count", claimed, "dir", dir)
	}
}
