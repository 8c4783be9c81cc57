package vxlan

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// The bytes VXLAN adds to an overlay packet on the underlay: the outer IP
// header (20 bytes IPv4, 40 IPv6), UDP (8), VXLAN (8) and the inner Ethernet
// header (14).
const (
	OverheadIPv4 = 50
	OverheadIPv6 = 70
)

// ErrNoUnderlayDevice is returned by UnderlayMTU when no link in the
// dataplane's namespace carries the underlay IP.
var ErrNoUnderlayDevice = errors.New("no link carries the underlay IP")

// Overhead is what VXLAN adds to an overlay packet whose outer header is of
// local's family.
func Overhead(local netip.Addr) int {
	if local.Unmap().Is4() {
		return OverheadIPv4
	}
	return OverheadIPv6
}

// VTEPMTUFor is the largest VTEP (and overlay) MTU whose encapsulated packets
// fit an underlay of underlayMTU bytes, VXLAN running over local's family,
// less extra bytes of a layer between VXLAN and the underlay (an encryption
// tunnel's overhead; 0 when there is none). 0 when nothing fits.
func VTEPMTUFor(underlayMTU int, local netip.Addr, extra int) int {
	return max(underlayMTU-Overhead(local)-extra, 0)
}

// UnderlayMTU returns the MTU of the link that carries ip (the agent's
// underlay IP, the VTEP's local address) in the dataplane's namespace, and
// the link's name.
func (d *Dataplane) UnderlayMTU(ip netip.Addr) (mtu int, link string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, "", errors.New("vxlan: dataplane closed")
	}
	ip = ip.Unmap()
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := d.h.AddrList(nil, fam)
	if err != nil {
		return 0, "", fmt.Errorf("vxlan: list addresses: %w", err)
	}
	for _, a := range addrs {
		if got, ok := netip.AddrFromSlice(a.IP); !ok || got.Unmap() != ip {
			continue
		}
		l, err := d.h.LinkByIndex(a.LinkIndex)
		if err != nil {
			return 0, "", fmt.Errorf("vxlan: link %d of %s: %w", a.LinkIndex, ip, err)
		}
		return l.Attrs().MTU, l.Attrs().Name, nil
	}
	return 0, "", fmt.Errorf("vxlan: %s: %w", ip, ErrNoUnderlayDevice)
}
