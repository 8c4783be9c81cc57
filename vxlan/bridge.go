package vxlan

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// reconcileBridges creates or fixes the desired bridges and deletes carve's
// bridges that are no longer desired. Incrementally, only bridges whose
// desired spec changed are looked at.
func (d *Dataplane) reconcileBridges(want []Bridge, prev *applied, full bool, rep *Report) map[string]Bridge {
	out := map[string]Bridge{}
	wanted := map[string]bool{}
	for _, b := range want {
		if err := b.validate(); err != nil {
			rep.fail(KindBridge, b.Name, "", "validate", err)
			continue
		}
		if wanted[b.Name] {
			rep.fail(KindBridge, b.Name, "", "validate", errors.New("bridge named twice"))
			continue
		}
		wanted[b.Name] = true
		if !full && prev != nil {
			if old, ok := prev.bridges[b.Name]; ok && old.equal(b) {
				out[b.Name] = b
				continue
			}
		}
		if err := d.ensureBridge(b, rep); err != nil {
			rep.fail(KindBridge, b.Name, "", "ensure", err)
			continue
		}
		out[b.Name] = b
	}
	var stale []string
	if full {
		links, err := d.h.LinkList()
		if err != nil {
			rep.fail(KindBridge, "*", "", "list links", err)
		}
		for _, l := range links {
			if _, ok := l.(*netlink.Bridge); ok && l.Attrs().Alias == OwnerAlias && !wanted[l.Attrs().Name] {
				stale = append(stale, l.Attrs().Name)
			}
		}
	} else if prev != nil {
		for name := range prev.bridges {
			if !wanted[name] {
				stale = append(stale, name)
			}
		}
	}
	for _, name := range stale {
		l, err := d.h.LinkByName(name)
		if err != nil {
			continue // already gone
		}
		if _, ok := l.(*netlink.Bridge); !ok || l.Attrs().Alias != OwnerAlias {
			continue // not carve's (any more): leave it
		}
		if err := d.h.LinkDel(l); err != nil {
			rep.fail(KindBridge, name, "", "delete", err)
			out[name] = Bridge{Name: name} // retried next time
			continue
		}
		rep.Bridges.Removed++
	}
	return out
}

func (d *Dataplane) ensureBridge(b Bridge, rep *Report) error {
	created := false
	link, err := d.h.LinkByName(b.Name)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		link = nil
	case err != nil:
		return err
	default:
		if _, ok := link.(*netlink.Bridge); !ok {
			if link.Attrs().Alias != OwnerAlias {
				return fmt.Errorf("%s exists and is a %s device that carve did not create", b.Name, link.Type())
			}
			if err := d.h.LinkDel(link); err != nil {
				return fmt.Errorf("delete non-bridge %s: %w", b.Name, err)
			}
			link = nil
		}
	}
	if link == nil {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: b.Name, MTU: b.MTU}}
		if err := d.h.LinkAdd(br); err != nil {
			return fmt.Errorf("create: %w", err)
		}
		created = true
		if link, err = d.h.LinkByName(b.Name); err != nil {
			return err
		}
		if err := d.h.LinkSetAlias(link, OwnerAlias); err != nil {
			return fmt.Errorf("mark: %w", err)
		}
		if err := d.pinMAC(link); err != nil {
			return err
		}
		rep.Bridges.Added++
	} else {
		changed := false
		if link.Attrs().Alias != OwnerAlias {
			// Adopted: it has the name the desired state gives a carve bridge.
			if err := d.h.LinkSetAlias(link, OwnerAlias); err != nil {
				return fmt.Errorf("mark: %w", err)
			}
			if err := d.pinMAC(link); err != nil {
				return err
			}
			changed = true
		}
		if b.MTU != 0 && link.Attrs().MTU != b.MTU {
			if err := d.h.LinkSetMTU(link, b.MTU); err != nil {
				return fmt.Errorf("set MTU: %w", err)
			}
			changed = true
		}
		if link.Attrs().Flags&net.FlagUp == 0 {
			changed = true
		}
		if changed {
			rep.Bridges.Updated++
		}
	}
	if b.Gateway6.IsValid() {
		// Linux solicits neighbours for forwarded IPv6 packets only from a
		// usable link-local address, which duplicate address detection
		// keeps tentative for a second or two after the bridge gets a
		// port: containers could not be reached from other hosts then.
		// The bridge is carve's, so it skips DAD (before it is up).
		changed, err := d.ensureSysctl("net/ipv6/conf/"+b.Name+"/accept_dad", "0")
		switch {
		case err != nil:
			rep.fail(KindSysctl, b.Name+" accept_dad", "", "set", err)
		case changed && !created:
			rep.Sysctls.Updated++
		}
	}
	// A block the agent granted away can lie inside the prefix of its own
	// containers (a /30 out of its first /28): for them it is on-link, so
	// they ARP for it on the bridge, while the kernel routes it out of the
	// VTEP to the recipient. With proxy_arp the bridge answers for exactly
	// the targets it routes out of another interface; local containers
	// (routed on the bridge itself) still answer for themselves.
	changed, err := d.ensureSysctl("net/ipv4/conf/"+b.Name+"/proxy_arp", "1")
	switch {
	case err != nil:
		rep.fail(KindSysctl, b.Name+" proxy_arp", "", "set", err)
	case changed && !created:
		rep.Sysctls.Updated++
	}
	d.ensureAddrs(link, b.addresses(), KindBridge, b.Name, rep)
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := d.h.LinkSetUp(link); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
	}
	return nil
}

// pinMAC sets a bridge's MAC to the one it has. A bridge whose MAC was never
// set takes the lowest MAC of its ports and changes it as containers come
// and go: the gateway MAC in the containers' ARP caches goes stale, and the
// CNI bridge plugin's CHECK fails for every container attached before the
// change (it compares the bridge MAC of the ADD result). The bridge plugin
// pins the MAC itself only when it adds the gateway address, which carve
// has already put there. Setting a MAC notifies
// NETDEV_CHANGEADDR, which flushes the bridge's neighbours, so it is done
// once, when carve creates or adopts the bridge.
func (d *Dataplane) pinMAC(link netlink.Link) error {
	if err := d.h.LinkSetHardwareAddr(link, link.Attrs().HardwareAddr); err != nil {
		return fmt.Errorf("pin MAC %s: %w", link.Attrs().HardwareAddr, err)
	}
	return nil
}
