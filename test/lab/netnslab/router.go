package netnslab

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// RouterLink is the name of a router's interface on the underlay bridge.
const RouterLink = "eth0"

// Router is a namespace on the underlay bridge that routes between it and
// the hosts moved behind it (MoveBehind): an underlay that is more than
// one L2 segment, as hosts in different racks see it.
type Router struct {
	*Namespace
	// Addr is the router's address on the underlay bridge.
	Addr netip.Prefix
}

// underlayNet is the whole lab underlay, routed via a router by the hosts
// whose segment is smaller.
var underlayNet = netip.PrefixFrom(underlayBase, UnderlayPrefixLen)

// AddRouter adds a router namespace joined to the underlay bridge with
// addr (in 198.18.0.0/15): it forwards, and answers ARP on the bridge for
// the hosts behind it (proxy ARP), so that the harness and the hosts still
// on the bridge reach them unchanged.
func (l *Lab) AddRouter(addr netip.Prefix) (*Router, error) {
	if !underlayNet.Contains(addr.Addr()) {
		return nil, fmt.Errorf("netnslab: router address %s is outside %s", addr, underlayNet)
	}
	n, err := l.AddNamespace("r" + addr.Addr().String())
	if err != nil {
		return nil, err
	}
	peer := "r" + strconv.Itoa(int(addr.Addr().As4()[3]))
	err = l.Underlay.withNetlink(func(uh netlinksafe.Handle) error {
		return n.withNetlink(func(rh netlinksafe.Handle) error {
			veth := &netlink.Veth{
				LinkAttrs:     netlink.LinkAttrs{Name: RouterLink, MTU: l.mtu},
				PeerName:      peer,
				PeerNamespace: netlink.NsFd(int(l.Underlay.ns.Fd())),
			}
			if err := rh.LinkAdd(veth); err != nil {
				return fmt.Errorf("add veth: %w", err)
			}
			br, err := uh.LinkByName(UnderlayBridge)
			if err != nil {
				return err
			}
			p, err := uh.LinkByName(peer)
			if err != nil {
				return err
			}
			if err := uh.LinkSetMaster(p, br); err != nil {
				return err
			}
			if err := uh.LinkSetUp(p); err != nil {
				return err
			}
			link, err := rh.LinkByName(RouterLink)
			if err != nil {
				return err
			}
			if err := rh.AddrAdd(link, &netlink.Addr{IPNet: prefixToIPNet(addr)}); err != nil {
				return err
			}
			return rh.LinkSetUp(link)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("netnslab: router %s: %w", addr, err)
	}
	for _, s := range []string{"net.ipv4.ip_forward", "net.ipv4.conf." + RouterLink + ".proxy_arp"} {
		if err := n.SetSysctl(s, "1"); err != nil {
			return nil, fmt.Errorf("netnslab: router %s: %w", addr, err)
		}
	}
	return &Router{Namespace: n, Addr: addr}, nil
}

// MoveBehind takes h off the underlay bridge and links it straight to the
// router: h keeps its underlay address, now with prefix length bits (its
// own segment, e.g. a /31), whose other address is the router's on that
// link; h routes the rest of the underlay via the router. Do it before the
// host's processes start: h's underlay interface is re-addressed.
func (r *Router) MoveBehind(h *Host, bits int) error {
	seg := netip.PrefixFrom(h.IP.Addr(), bits).Masked()
	gw := seg.Addr()
	if gw == h.IP.Addr() {
		gw = gw.Next()
	}
	if bits >= 32 || !seg.Contains(gw) || gw == h.IP.Addr() {
		return fmt.Errorf("netnslab: segment %s has no address for the router beside %s", seg, h.IP.Addr())
	}
	peer := "h" + strconv.Itoa(h.Index)
	err := r.lab.Underlay.withNetlink(func(uh netlinksafe.Handle) error {
		p, err := uh.LinkByName(peer)
		if err != nil {
			return fmt.Errorf("host %d's veth in the underlay: %w", h.Index, err)
		}
		if err := uh.LinkSetNoMaster(p); err != nil {
			return err
		}
		return uh.LinkSetNsFd(p, int(r.ns.Fd()))
	})
	if err == nil {
		err = r.withNetlink(func(rh netlinksafe.Handle) error {
			p, err := rh.LinkByName(peer)
			if err != nil {
				return err
			}
			if err := rh.AddrAdd(p, &netlink.Addr{IPNet: prefixToIPNet(netip.PrefixFrom(gw, bits))}); err != nil {
				return err
			}
			return rh.LinkSetUp(p)
		})
	}
	if err == nil {
		err = h.readdress(bits, gw, false)
	}
	if err != nil {
		return fmt.Errorf("netnslab: move host %d behind router %s: %w", h.Index, r.Addr.Addr(), err)
	}
	return nil
}

// NarrowSegment gives h's underlay address the prefix length bits (a
// segment smaller than the bridge, e.g. the /31 of two hosts) and routes
// the rest of the underlay via the router, whose address on the bridge is
// then outside h's segment (onlink). Do it before the host's processes
// start.
func (r *Router) NarrowSegment(h *Host, bits int) error {
	if err := h.readdress(bits, r.Addr.Addr(), true); err != nil {
		return fmt.Errorf("netnslab: narrow host %d's segment: %w", h.Index, err)
	}
	return nil
}

// readdress replaces h's underlay address with the same address of prefix
// length bits, and routes the lab's underlay via gw.
func (h *Host) readdress(bits int, gw netip.Addr, onlink bool) error {
	return h.withNetlink(func(hh netlinksafe.Handle) error {
		link, err := hh.LinkByName(h.Link)
		if err != nil {
			return err
		}
		if err := hh.AddrDel(link, &netlink.Addr{IPNet: prefixToIPNet(h.IP)}); err != nil {
			return fmt.Errorf("remove %s: %w", h.IP, err)
		}
		if err := hh.AddrAdd(link, &netlink.Addr{IPNet: prefixToIPNet(netip.PrefixFrom(h.IP.Addr(), bits))}); err != nil {
			return err
		}
		if err := hh.LinkSetUp(link); err != nil {
			return err
		}
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: prefixToIPNet(underlayNet), Gw: net.IP(gw.AsSlice())}
		if onlink {
			route.Flags = int(netlink.FLAG_ONLINK)
		}
		return hh.RouteAdd(route)
	})
}
