package vxlan

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ForgetNeighbour deletes the neighbour entry (ARP or NDP) the kernel learned
// for addr on the bridge named bridge, and reports whether there was one. A
// missing bridge or entry is no error. Entries someone set by hand
// (permanent, noarp) are left alone.
//
// The agent calls it when it frees a container's address. The host's entry
// for the address names the old container's MAC and stays REACHABLE for
// base_reachable_time (15-45 s) after its last confirmation, then costs
// DELAY and PROBE (about 8 s more) before the kernel asks again: a new
// container given the address is unreachable from outside until then,
// unless it sends something first (an ARP request from it overrides the
// entry). The gratuitous ARP its interface sends when it comes up (arp_notify,
// which the bridge plugin sets) is no help: it leaves before the host end of
// the veth, whose carrier the bridge learns asynchronously (linkwatch), is
// forwarding, and the bridge drops it. Without the entry the kernel resolves
// the address afresh and the new container answers at once.
//
// It takes its own netlink socket and lock, so it never waits for a
// reconcile.
func (d *Dataplane) ForgetNeighbour(bridge string, addr netip.Addr) (forgotten bool, err error) {
	d.nmu.Lock()
	defer d.nmu.Unlock()
	if d.nclosed {
		return false, errors.New("vxlan: the dataplane is closed")
	}
	addr = addr.Unmap()
	if !addr.IsValid() {
		return false, fmt.Errorf("vxlan: forget a neighbour on %s: no address", bridge)
	}
	link, err := d.nh.LinkByName(bridge)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("vxlan: bridge %s: %w", bridge, err)
	}
	fam := netlink.FAMILY_V4
	if addr.Is6() {
		fam = netlink.FAMILY_V6
	}
	var neighs []netlink.Neigh
	for range 5 {
		// A dump a concurrent change interrupted may miss the entry: retry.
		if neighs, err = d.nh.NeighList(link.Attrs().Index, fam); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return false, fmt.Errorf("vxlan: neighbours of %s: %w", bridge, err)
	}
	for _, n := range neighs {
		if got, ok := netip.AddrFromSlice(n.IP); !ok || got.Unmap() != addr || n.LinkIndex != link.Attrs().Index {
			continue
		}
		if n.State&(unix.NUD_PERMANENT|unix.NUD_NOARP) != 0 {
			return false, nil
		}
		if err := d.nh.NeighDel(&n); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return false, nil // gone meanwhile
			}
			return false, fmt.Errorf("vxlan: forget neighbour %s on %s: %w", addr, bridge, err)
		}
		return true, nil
	}
	return false, nil
}
