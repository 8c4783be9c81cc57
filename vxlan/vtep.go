package vxlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ensureVTEP makes the VTEP device match v. fresh reports that the device
// was created, replaced or brought up, i.e. that its neighbours, FDB and
// routes may be gone and must be read back.
func (d *Dataplane) ensureVTEP(v VTEP, prev *applied, full bool, rep *Report) (link netlink.Link, fresh bool, err error) {
	// A VTEP carve made under another name (the configured name changed).
	if full {
		links, err := d.h.LinkList()
		if err != nil {
			return nil, false, fmt.Errorf("list links: %w", err)
		}
		for _, l := range links {
			if _, ok := l.(*netlink.Vxlan); ok && l.Attrs().Alias == OwnerAlias && l.Attrs().Name != v.Name {
				if err := d.h.LinkDel(l); err != nil {
					rep.fail(KindVTEP, l.Attrs().Name, "", "delete", err)
				} else {
					rep.VTEP.Removed++
				}
			}
		}
	} else if prev != nil && prev.vtep.Name != v.Name {
		if l, err := d.h.LinkByName(prev.vtep.Name); err == nil && l.Attrs().Alias == OwnerAlias {
			if err := d.h.LinkDel(l); err != nil {
				rep.fail(KindVTEP, prev.vtep.Name, "", "delete", err)
			} else {
				rep.VTEP.Removed++
			}
		}
	}

	link, err = d.h.LinkByName(v.Name)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		link, err = d.createVTEP(v)
		if err != nil {
			return nil, false, err
		}
		rep.VTEP.Added++
		rep.Addresses.Added++
		return link, true, nil
	case err != nil:
		return nil, false, fmt.Errorf("look up %s: %w", v.Name, err)
	}
	if why := vtepMismatch(link, v); why != "" {
		// A device that is not a VXLAN device is only replaced when carve
		// made it; VXLAN devices of this name are the VTEP (e.g. one left
		// by a DC/OS overlay agent) and are replaced when they differ.
		if _, isVX := link.(*netlink.Vxlan); !isVX && link.Attrs().Alias != OwnerAlias {
			return nil, false, fmt.Errorf("%s exists and is a %s device that carve did not create", v.Name, link.Type())
		}
		d.log.Info("vxlan: replacing VTEP", "name", v.Name, "reason", why)
		if err := d.h.LinkDel(link); err != nil {
			return nil, false, fmt.Errorf("delete mismatched %s: %w", v.Name, err)
		}
		link, err = d.createVTEP(v)
		if err != nil {
			return nil, false, err
		}
		rep.VTEP.Updated++
		rep.Addresses.Added++
		return link, true, nil
	}
	// Matching device: fix in place only what does not disturb its entries.
	// The MAC is never set again (that flushes the neighbours).
	changed := false
	if v.MTU != 0 && link.Attrs().MTU != v.MTU {
		if err := d.h.LinkSetMTU(link, v.MTU); err != nil {
			return nil, false, fmt.Errorf("set MTU of %s: %w", v.Name, err)
		}
		changed = true
	}
	if link.Attrs().Alias != OwnerAlias {
		if err := d.h.LinkSetAlias(link, OwnerAlias); err != nil {
			return nil, false, fmt.Errorf("mark %s: %w", v.Name, err)
		}
		changed = true
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		// Taking a device down drops its routes: they must be re-read.
		if err := d.h.LinkSetUp(link); err != nil {
			return nil, false, fmt.Errorf("set %s up: %w", v.Name, err)
		}
		changed, fresh = true, true
	}
	if changed {
		rep.VTEP.Updated++
	}
	// Checked on every pass (one small dump). A missing address means
	// someone removed it, and removing a device's last IPv4 address flushes
	// its routes and neighbours: read them back then.
	if d.ensureAddrs(link, v.addresses(), KindAddress, v.Name, rep) && prev != nil && prev.vtep.Address == v.Address {
		fresh = true
	}
	return link, fresh, nil
}

// vtepMismatch says why an existing link cannot serve as the VTEP v, or ""
// when it can (MTU, alias and up state are fixed in place).
func vtepMismatch(l netlink.Link, v VTEP) string {
	vx, ok := l.(*netlink.Vxlan)
	if !ok {
		return "not a vxlan device but " + l.Type()
	}
	local, _ := netip.AddrFromSlice(vx.SrcAddr)
	switch {
	case vx.VxlanId != int(v.VNI):
		return fmt.Sprintf("VNI %d, want %d", vx.VxlanId, v.VNI)
	case vx.Port != int(v.Port):
		return fmt.Sprintf("port %d, want %d", vx.Port, v.Port)
	case local.Unmap() != v.Local.Unmap():
		return fmt.Sprintf("local %v, want %s", vx.SrcAddr, v.Local)
	case vx.Learning:
		return "learning on"
	case vx.FlowBased:
		return "external (flow based)"
	case len(vx.Group) > 0 && !vx.Group.IsUnspecified():
		return "multicast group " + vx.Group.String()
	case vx.VtepDevIndex != 0:
		return "bound to an underlay device"
	case !slices.Equal(vx.HardwareAddr, v.MAC):
		return fmt.Sprintf("MAC %s, want %s", vx.HardwareAddr, v.MAC)
	}
	return ""
}

func (d *Dataplane) createVTEP(v VTEP) (netlink.Link, error) {
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: v.Name, MTU: v.MTU, HardwareAddr: slices.Clone(v.MAC)},
		VxlanId:   int(v.VNI),
		SrcAddr:   net.IP(v.Local.Unmap().AsSlice()),
		Port:      int(v.Port),
		Learning:  false,
		UDPCSum:   true,
	}
	if err := d.h.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("create %s: %w", v.Name, err)
	}
	link, err := d.h.LinkByName(v.Name)
	if err != nil {
		return nil, fmt.Errorf("look up new %s: %w", v.Name, err)
	}
	if err := d.h.LinkSetAlias(link, OwnerAlias); err != nil {
		return nil, fmt.Errorf("mark %s: %w", v.Name, err)
	}
	if err := d.h.AddrReplace(link, &netlink.Addr{IPNet: ipNet(v.Address)}); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", v.Address, v.Name, err)
	}
	if v.Address6.IsValid() {
		// No duplicate address detection: the address would stay tentative.
		if err := d.h.AddrReplace(link, &netlink.Addr{IPNet: ipNet(v.Address6), Flags: unix.IFA_F_NODAD}); err != nil {
			return nil, fmt.Errorf("address %s on %s: %w", v.Address6, v.Name, err)
		}
	}
	if err := d.h.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", v.Name, err)
	}
	return d.h.LinkByName(v.Name)
}

func cloneVTEP(v VTEP) VTEP {
	v.MAC = slices.Clone(v.MAC)
	return v
}
