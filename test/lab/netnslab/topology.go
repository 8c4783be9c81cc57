package netnslab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// AddHost creates the next host namespace, joined to the underlay bridge by a
// veth pair, with its underlay address on Link and the link up.
func (l *Lab) AddHost() (*Host, error) {
	l.mu.Lock()
	idx := len(l.hosts) + 1
	l.mu.Unlock()
	ipInt := ipv4ToUint(underlayBase) + 10 + uint32(idx)
	ip := uintToIPv4(ipInt)
	if !netip.PrefixFrom(underlayBase, UnderlayPrefixLen).Contains(ip) {
		return nil, fmt.Errorf("netnslab: too many hosts (%d)", idx)
	}
	n, err := l.AddNamespace("h" + strconv.Itoa(idx))
	if err != nil {
		return nil, err
	}
	h := &Host{Namespace: n, Index: idx, IP: netip.PrefixFrom(ip, UnderlayPrefixLen), Link: HostLink}
	peer := "h" + strconv.Itoa(idx)
	err = l.Underlay.withNetlink(func(uh netlinksafe.Handle) error {
		return n.withNetlink(func(hh netlinksafe.Handle) error {
			// Created inside the host, its peer moved straight into the
			// underlay: nothing ever appears in the caller's namespace.
			veth := &netlink.Veth{
				LinkAttrs:     netlink.LinkAttrs{Name: HostLink, MTU: l.mtu},
				PeerName:      peer,
				PeerNamespace: netlink.NsFd(int(l.Underlay.ns.Fd())),
			}
			if err := hh.LinkAdd(veth); err != nil {
				return fmt.Errorf("add veth: %w", err)
			}
			br, err := uh.LinkByName(UnderlayBridge)
			if err != nil {
				return err
			}
			p, err := uh.LinkByName(peer)
			if err != nil {
				return fmt.Errorf("find veth peer in underlay: %w", err)
			}
			if err := uh.LinkSetMaster(p, br); err != nil {
				return err
			}
			if err := uh.LinkSetUp(p); err != nil {
				return err
			}
			link, err := hh.LinkByName(HostLink)
			if err != nil {
				return err
			}
			if err := hh.AddrAdd(link, &netlink.Addr{IPNet: prefixToIPNet(h.IP)}); err != nil {
				return fmt.Errorf("add underlay address: %w", err)
			}
			return hh.LinkSetUp(link)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("netnslab: host %d: %w", idx, err)
	}
	l.mu.Lock()
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()
	return h, nil
}

// AddBridge creates a bridge inside the host with the given address (if
// valid) and MTU (if non-zero), up. The dataplane creates its own bridges;
// this is for lab tests that need one without it.
func (h *Host) AddBridge(name string, addr netip.Prefix, mtu int) error {
	return h.withNetlink(func(nh netlinksafe.Handle) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}}
		if err := nh.LinkAdd(br); err != nil {
			return fmt.Errorf("netnslab: add bridge %s: %w", name, err)
		}
		if addr.IsValid() {
			if err := nh.AddrAdd(br, &netlink.Addr{IPNet: prefixToIPNet(addr), Flags: nodad(addr)}); err != nil {
				return fmt.Errorf("netnslab: address on %s: %w", name, err)
			}
		}
		return nh.LinkSetUp(br)
	})
}

// AddContainer creates a container namespace (named after the host) attached
// to cfg.Bridge, which must exist inside the host, with cfg's addresses and
// default routes. The host-side veth end is up and enslaved to the bridge.
func (l *Lab) AddContainer(h *Host, cfg ContainerConfig) (*Container, error) {
	if !cfg.Address.IsValid() {
		return nil, errors.New("netnslab: container needs an address")
	}
	l.mu.Lock()
	l.vethSeq++
	seq := l.vethSeq
	l.mu.Unlock()
	n, err := l.AddNamespace(fmt.Sprintf("h%dc%d", h.Index, seq))
	if err != nil {
		return nil, err
	}
	c := &Container{Namespace: n, Host: h, HostLink: "vc" + strconv.Itoa(seq), Config: cfg}
	err = h.withNetlink(func(hh netlinksafe.Handle) error {
		return n.withNetlink(func(ch netlinksafe.Handle) error {
			br, err := hh.LinkByName(cfg.Bridge)
			if err != nil {
				return fmt.Errorf("bridge %s in host %s: %w", cfg.Bridge, h.Name, err)
			}
			mtu := cfg.MTU
			if mtu == 0 {
				mtu = br.Attrs().MTU
			}
			veth := &netlink.Veth{
				LinkAttrs:     netlink.LinkAttrs{Name: c.HostLink, MTU: mtu},
				PeerName:      ContainerLink,
				PeerNamespace: netlink.NsFd(int(n.ns.Fd())),
			}
			if err := hh.LinkAdd(veth); err != nil {
				return fmt.Errorf("add veth: %w", err)
			}
			hl, err := hh.LinkByName(c.HostLink)
			if err != nil {
				return err
			}
			if err := hh.LinkSetMaster(hl, br); err != nil {
				return err
			}
			if err := hh.LinkSetUp(hl); err != nil {
				return err
			}
			cl, err := ch.LinkByName(ContainerLink)
			if err != nil {
				return err
			}
			for _, a := range []netip.Prefix{cfg.Address, cfg.Address6} {
				if !a.IsValid() {
					continue
				}
				if err := ch.AddrAdd(cl, &netlink.Addr{IPNet: prefixToIPNet(a), Flags: nodad(a)}); err != nil {
					return fmt.Errorf("address %s: %w", a, err)
				}
			}
			if err := ch.LinkSetUp(cl); err != nil {
				return err
			}
			for _, gw := range []netip.Addr{cfg.Gateway, cfg.Gateway6} {
				if !gw.IsValid() {
					continue
				}
				r := &netlink.Route{LinkIndex: cl.Attrs().Index, Gw: net.IP(gw.AsSlice()), Family: family(gw)}
				if err := ch.RouteAdd(r); err != nil {
					return fmt.Errorf("default route via %s: %w", gw, err)
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("netnslab: container on host %d: %w", h.Index, err)
	}
	return c, nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

// nodad skips IPv6 duplicate address detection, which would leave a fresh
// address "tentative" (unusable) for a second or more.
func nodad(p netip.Prefix) int {
	if p.Addr().Is6() {
		return unix.IFA_F_NODAD
	}
	return 0
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func ipv4ToUint(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func uintToIPv4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
