package vxlan

// The routed data path: between hosts on one L2 segment no tunnel is
// needed (flannel's host-gw, Calico's and Cilium's native routing). A peer
// on this host's underlay segment gets its subnets routed via its underlay
// IP on the underlay device, "ip route <block> via <peer ip> dev <underlay>
// onlink", with no neighbour or FDB entry on the VTEP: the kernel resolves
// the peer's underlay MAC by ARP as for any neighbour on the segment. The
// peers elsewhere stay on VXLAN. DESIGN.md, "Dataplane".

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
)

// Mode is how a peer is reached; its values are meant to be used as a
// metric label.
type Mode string

// The modes of a peer.
const (
	// ModeVXLAN: through the VTEP (neighbour, FDB entry, routes via its
	// VTEP IP).
	ModeVXLAN Mode = "vxlan"
	// ModeRouted: plain routes via its underlay IP on the underlay device.
	ModeRouted Mode = "routed"
)

// Modes lists every Mode, in a stable order (for metrics).
var Modes = []Mode{ModeVXLAN, ModeRouted}

// PeersByMode counts the peers of the report by mode.
func (r *Report) PeersByMode() map[Mode]int {
	out := make(map[Mode]int, len(Modes))
	for _, m := range Modes {
		out[m] = 0
	}
	for _, m := range r.Modes {
		out[m]++
	}
	return out
}

// underlay is the device that holds this host's underlay address, and that
// address with the prefix length it was configured with: the segment.
type underlay struct {
	index  int
	name   string
	prefix netip.Prefix
}

// onSegment tells whether a peer's underlay IP is on this host's segment:
// inside the prefix of the host's own underlay address (the peer is on-link,
// reached without a gateway), or inside one declared segment together with
// the host's own address. A nil underlay (routed mode off) holds no one.
func (u *underlay) onSegment(ip netip.Addr, segments []netip.Prefix) bool {
	if u == nil || !ip.IsValid() || ip == u.prefix.Addr() {
		return false
	}
	if u.prefix.Masked().Contains(ip) && u.prefix.Bits() < u.prefix.Addr().BitLen() {
		return true
	}
	for _, s := range segments {
		if s.Contains(ip) && s.Contains(u.prefix.Addr()) {
			return true
		}
	}
	return false
}

// findUnderlay looks up the device carrying the local underlay IP in the
// dataplane's namespace.
func (d *Dataplane) findUnderlay(local netip.Addr) (*underlay, error) {
	fam := netlink.FAMILY_V4
	if !local.Unmap().Is4() {
		fam = netlink.FAMILY_V6
	}
	addrs, err := d.h.AddrList(nil, fam)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		p, ok := prefixOf(a.IPNet)
		if !ok || p.Addr().Unmap() != local.Unmap() {
			continue
		}
		l, err := d.h.LinkByIndex(a.LinkIndex)
		if err != nil {
			return nil, fmt.Errorf("the link of %s: %w", local, err)
		}
		return &underlay{index: a.LinkIndex, name: l.Attrs().Name, prefix: netip.PrefixFrom(p.Addr().Unmap(), p.Bits())}, nil
	}
	return nil, fmt.Errorf("%s: %w", local, ErrNoUnderlayDevice)
}

// underlayFor is the underlay of routed mode, or nil when routed mode is
// off or the underlay cannot be found (then every peer stays on VXLAN, and
// the failure is in the report).
func (d *Dataplane) underlayFor(want *Desired, rep *Report) *underlay {
	if !want.Routed {
		return nil
	}
	u, err := d.findUnderlay(want.VTEP.Local)
	if err != nil {
		rep.fail(KindAddress, want.VTEP.Local.String(), "", "find underlay", err)
		return nil
	}
	return u
}

// ensureLooseRPFilter has the underlay device and the VTEP accept packets
// from a routed peer's containers even while that peer and this host
// disagree on their mode (a switch reaches the hosts at different
// moments): strict reverse path filtering (1) would drop what comes in on
// the underlay device from a subnet this host still routes through the
// VTEP, and what comes in on the VTEP from one it already routes via the
// underlay. Loose (2) still drops sources with no route at all; 0 (off) is
// left as it is. The effective value is the larger of conf/all and
// conf/<dev>, so the devices' are set. true means done.
func (d *Dataplane) ensureLooseRPFilter(u *underlay, vtep string, rep *Report) bool {
	if !u.prefix.Addr().Is4() {
		return true // IPv6 has no rp_filter sysctl
	}
	ok := true
	for _, dev := range []string{u.name, vtep} {
		name := "net/ipv4/conf/" + dev + "/rp_filter"
		var cur string
		err := d.inNS(func() error {
			v, err := sysctl.Sysctl(name)
			cur = strings.TrimSpace(v)
			return err
		})
		switch {
		case err != nil:
			rep.fail(KindSysctl, name, "", "read", err)
			ok = false
		case cur != "0" && cur != "2":
			ok = d.setSysctl(name, "2", rep) && ok
		}
	}
	return ok
}
