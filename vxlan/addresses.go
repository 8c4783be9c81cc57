package vxlan

import (
	"net"
	"net/netip"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ensureAddrs makes want the global addresses of a carve link: missing ones
// are added, then other global ones removed (link-local and host-scope
// addresses are the kernel's and stay). Adding first matters: removing the
// last IPv4 address of a device makes the kernel flush its routes and
// neighbours. missing reports that a wanted address was not there.
func (d *Dataplane) ensureAddrs(link netlink.Link, want []netip.Prefix, kind Kind, name string, rep *Report) (missing bool) {
	// netlinksafe wraps only the package-level address dump, which opens
	// its socket in the calling thread's namespace.
	var have []netlink.Addr
	err := d.inNS(func() error {
		var err error
		have, err = netlinksafe.AddrList(link, netlink.FAMILY_ALL)
		return err
	})
	if err != nil {
		rep.fail(kind, name, "", "list addresses", err)
		return true
	}
	present := map[netip.Prefix]bool{}
	var extra []netlink.Addr
	for _, a := range have {
		p, ok := prefixOf(a.IPNet)
		if !ok || a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		if slices.Contains(want, p) {
			present[p] = true
		} else {
			extra = append(extra, a)
		}
	}
	for _, p := range want {
		if present[p] {
			continue
		}
		missing = true
		a := &netlink.Addr{IPNet: ipNet(p)}
		if p.Addr().Is6() {
			// No duplicate address detection: the gateway would stay
			// tentative (unusable) for a second or more.
			a.Flags = unix.IFA_F_NODAD
		}
		if err := d.h.AddrReplace(link, a); err != nil {
			rep.fail(KindAddress, p.String(), "", "add", err)
		} else {
			rep.Addresses.Added++
		}
	}
	for _, a := range extra {
		p, _ := prefixOf(a.IPNet)
		if err := d.h.AddrDel(link, &a); err != nil {
			rep.fail(KindAddress, p.String(), "", "delete", err)
		} else {
			rep.Addresses.Removed++
		}
	}
	return missing
}

func ipNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}
