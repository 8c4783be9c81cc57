package labcluster

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/vxlan"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// KernelState is what a host's kernel holds for the overlay, read through
// netlink: the VTEP, and carve's entries on it. Tests assert on it instead
// of on what the agent says it did.
type KernelState struct {
	// VTEP is nil when the host has no VTEP device.
	VTEP *VTEPState
	// Neighbours are the permanent neighbour entries on the VTEP: IP -> MAC.
	Neighbours map[netip.Addr]string
	// FDB are the permanent "self" FDB entries on the VTEP: MAC -> underlay
	// destinations (more than one is a bug).
	FDB map[string][]netip.Addr
	// Routes are the routes of protocol vxlan.Protocol: destination -> next hop.
	Routes map[netip.Prefix]netip.Addr
}

// VTEPState is the VTEP device as the kernel has it, to compare with the
// lease the masters gave (MAC, address) and the host's underlay IP (Local).
type VTEPState struct {
	Name  string         // device name
	Index int            // interface index
	MAC   string         // its MAC, lower case
	VNI   int            // VXLAN id
	Port  int            // UDP destination port
	Local netip.Addr     // source underlay address of encapsulated packets
	MTU   int            // device MTU
	Up    bool           // administratively up
	Addrs []netip.Prefix // addresses on the device
}

// ReadKernel reads the VTEP called vtepName and carve's entries on it inside
// ns. A missing VTEP is not an error (VTEP is nil, the maps are empty). The
// link and route dumps are retried when a concurrent change interrupts them
// (netlinksafe); the address and neighbour dumps, which netlinksafe does not
// wrap, fail instead, and the callers' waits read again.
func ReadKernel(ns *netnslab.Namespace, vtepName string) (*KernelState, error) {
	nh, err := netlinksafe.NewHandleAt(ns.NsHandle())
	if err != nil {
		return nil, fmt.Errorf("labcluster: netlink in %s: %w", ns.Name, err)
	}
	defer nh.Close()
	ks := &KernelState{Neighbours: map[netip.Addr]string{}, FDB: map[string][]netip.Addr{}, Routes: map[netip.Prefix]netip.Addr{}}
	link, err := nh.LinkByName(vtepName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return ks, nil
		}
		return nil, fmt.Errorf("labcluster: %s in %s: %w", vtepName, ns.Name, err)
	}
	idx := link.Attrs().Index
	v := &VTEPState{Name: vtepName, Index: idx, MAC: link.Attrs().HardwareAddr.String(), MTU: link.Attrs().MTU,
		Up: link.Attrs().Flags&net.FlagUp != 0}
	if vx, ok := link.(*netlink.Vxlan); ok {
		v.VNI, v.Port = vx.VxlanId, vx.Port
		v.Local = addrOf(vx.SrcAddr)
	}
	addrs, err := nh.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("labcluster: addresses of %s in %s: %w", vtepName, ns.Name, err)
	}
	for _, a := range addrs {
		ones, _ := a.Mask.Size()
		v.Addrs = append(v.Addrs, netip.PrefixFrom(addrOf(a.IP), ones))
	}
	ks.VTEP = v

	neighs, err := nh.NeighList(idx, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("labcluster: neighbours in %s: %w", ns.Name, err)
	}
	for _, n := range neighs {
		if n.LinkIndex == idx && n.State&netlink.NUD_PERMANENT != 0 {
			ks.Neighbours[addrOf(n.IP)] = n.HardwareAddr.String()
		}
	}
	fdb, err := nh.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return nil, fmt.Errorf("labcluster: fdb in %s: %w", ns.Name, err)
	}
	for _, n := range fdb {
		if n.LinkIndex != idx || n.Flags&netlink.NTF_SELF == 0 || n.State&netlink.NUD_PERMANENT == 0 {
			continue
		}
		mac := n.HardwareAddr.String()
		ks.FDB[mac] = append(ks.FDB[mac], addrOf(n.IP))
	}
	routes, err := nh.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: vxlan.Protocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("labcluster: routes in %s: %w", ns.Name, err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		ks.Routes[netip.PrefixFrom(addrOf(r.Dst.IP), ones)] = addrOf(r.Gw)
	}
	return ks, nil
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// PeerEntries are the kernel entries that one agent's record asks every
// other host to hold (DESIGN.md, "Dataplane").
type PeerEntries struct {
	AgentID    string         // the agent the entries are for
	UnderlayIP netip.Addr     // destination of its FDB entry
	VTEPIP     netip.Addr     // its neighbour entry's IP, its routes' next hop
	VTEPMAC    string         // its neighbour entry's MAC, its FDB entry's key
	Subnets    []netip.Prefix // routed to it, one per overlay
}

// EntriesOf derives PeerEntries from an agent record (the masters' or the
// agent's own). It fails when the record lacks an IP or a VXLAN backend.
func EntriesOf(a api.AgentInfo) (PeerEntries, error) {
	pe := PeerEntries{AgentID: a.AgentID}
	ip, err := netip.ParseAddr(a.IP)
	if err != nil {
		return pe, fmt.Errorf("agent %s: ip %q: %w", a.AgentID, a.IP, err)
	}
	pe.UnderlayIP = ip
	for _, ov := range a.Overlays {
		if ov.Backend != nil && ov.Backend.VXLAN != nil && !pe.VTEPIP.IsValid() {
			p, err := netip.ParsePrefix(ov.Backend.VXLAN.VTEPIP)
			if err != nil {
				return pe, fmt.Errorf("agent %s: vtep_ip %q: %w", a.AgentID, ov.Backend.VXLAN.VTEPIP, err)
			}
			mac, err := net.ParseMAC(ov.Backend.VXLAN.VTEPMAC)
			if err != nil {
				return pe, fmt.Errorf("agent %s: vtep_mac %q: %w", a.AgentID, ov.Backend.VXLAN.VTEPMAC, err)
			}
			pe.VTEPIP, pe.VTEPMAC = p.Addr(), mac.String()
		}
		if ov.Subnet == "" {
			continue
		}
		s, err := netip.ParsePrefix(ov.Subnet)
		if err != nil {
			return pe, fmt.Errorf("agent %s: subnet %q: %w", a.AgentID, ov.Subnet, err)
		}
		pe.Subnets = append(pe.Subnets, s)
	}
	if !pe.VTEPIP.IsValid() {
		return pe, fmt.Errorf("agent %s: no VXLAN backend in its record", a.AgentID)
	}
	return pe, nil
}

// HasPeer returns nil when the kernel holds every entry of p (neighbour,
// FDB entry to p's underlay IP and nothing else, a route per IPv4 subnet via
// p's VTEP IP), and otherwise an error naming what is missing or wrong.
func (k *KernelState) HasPeer(p PeerEntries) error {
	var probs []string
	if k.VTEP == nil {
		return errors.New("no VTEP")
	}
	if got, ok := k.Neighbours[p.VTEPIP]; !ok {
		probs = append(probs, fmt.Sprintf("no neighbour %s", p.VTEPIP))
	} else if got != p.VTEPMAC {
		probs = append(probs, fmt.Sprintf("neighbour %s -> %s, want %s", p.VTEPIP, got, p.VTEPMAC))
	}
	if got := k.FDB[p.VTEPMAC]; len(got) != 1 || got[0] != p.UnderlayIP {
		probs = append(probs, fmt.Sprintf("fdb %s -> %v, want [%s]", p.VTEPMAC, got, p.UnderlayIP))
	}
	for _, s := range p.Subnets {
		if !s.Addr().Is4() {
			continue
		}
		if via, ok := k.Routes[s]; !ok {
			probs = append(probs, fmt.Sprintf("no route %s", s))
		} else if via != p.VTEPIP {
			probs = append(probs, fmt.Sprintf("route %s via %s, want via %s", s, via, p.VTEPIP))
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("agent %s: %s", p.AgentID, strings.Join(probs, "; "))
	}
	return nil
}

// LacksPeer returns nil when the kernel holds none of p's entries (no
// neighbour for its VTEP IP, no FDB entry for its MAC, no route for its
// subnets), and otherwise an error naming what is left.
func (k *KernelState) LacksPeer(p PeerEntries) error {
	var left []string
	if mac, ok := k.Neighbours[p.VTEPIP]; ok {
		left = append(left, fmt.Sprintf("neighbour %s -> %s", p.VTEPIP, mac))
	}
	if dst, ok := k.FDB[p.VTEPMAC]; ok {
		left = append(left, fmt.Sprintf("fdb %s -> %v", p.VTEPMAC, dst))
	}
	for _, s := range p.Subnets {
		if via, ok := k.Routes[s]; ok {
			left = append(left, fmt.Sprintf("route %s via %s", s, via))
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("agent %s still present: %s", p.AgentID, strings.Join(left, "; "))
	}
	return nil
}

// String renders the state in the order `ip` would list it, for logs.
func (k *KernelState) String() string {
	var b strings.Builder
	if k.VTEP == nil {
		b.WriteString("no VTEP\n")
	} else {
		v := k.VTEP
		fmt.Fprintf(&b, "%s: vni %d port %d local %s mac %s mtu %d up %v addrs %v\n", v.Name, v.VNI, v.Port, v.Local, v.MAC, v.MTU, v.Up, v.Addrs)
	}
	for _, a := range slices.SortedFunc(maps.Keys(k.Neighbours), func(x, y netip.Addr) int { return x.Compare(y) }) {
		fmt.Fprintf(&b, "neigh %s lladdr %s\n", a, k.Neighbours[a])
	}
	for _, m := range slices.Sorted(maps.Keys(k.FDB)) {
		fmt.Fprintf(&b, "fdb %s dst %v\n", m, k.FDB[m])
	}
	for _, p := range slices.SortedFunc(maps.Keys(k.Routes), func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return x.Bits() - y.Bits()
	}) {
		fmt.Fprintf(&b, "route %s via %s\n", p, k.Routes[p])
	}
	return b.String()
}
