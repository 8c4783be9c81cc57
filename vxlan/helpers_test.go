package vxlan_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
	"github.com/carve-net/carve/vxlan"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const vtepName = "vtep1024"

// env is one host namespace with a dataplane on it, and a netlink handle
// (from the ordinary netlink library, independent of the dataplane's own
// batching code) to inspect or change the kernel by hand.
type env struct {
	lab  *netnslab.Lab
	host *netnslab.Host
	dp   *vxlan.Dataplane
	nl   *netlink.Handle
}

func newEnv(t *testing.T) *env {
	t.Helper()
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	h := lab.Hosts()[0]
	return newEnvOn(t, lab, h)
}

func newEnvOn(t *testing.T, lab *netnslab.Lab, h *netnslab.Host) *env {
	t.Helper()
	return newEnvWith(t, lab, h, vxlan.Options{})
}

// newEnvWith is newEnvOn with the dataplane's options (its namespace and
// a silent logger filled in).
func newEnvWith(t *testing.T, lab *netnslab.Lab, h *netnslab.Host, opts vxlan.Options) *env {
	t.Helper()
	opts.NetNS, opts.Logger = h.NsHandle(), slog.New(slog.DiscardHandler)
	dp, err := vxlan.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	nh, err := h.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	return &env{lab: lab, host: h, dp: dp, nl: nh}
}

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// vtepIP is the VTEP IP of agent i (100.64.0.0/16, lowest hosts first).
func vtepIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)})
}

// vtepMAC derives the MAC from the VTEP IP as the masters do.
func vtepMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x70, 0xb3, 0xd5, 0x40, byte(i >> 8), byte(i)}
}

func underlayIP(i int) netip.Addr {
	v := uint32(198)<<24 | uint32(18)<<16 | uint32(10+i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// subnet is agent i's /24 in 10.128.0.0/9.
func subnet(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + i>>8), byte(i), 0}), 24)
}

func peer(i int) vxlan.Peer {
	return vxlan.Peer{
		ID:         fmt.Sprintf("agent-%05d", i),
		UnderlayIP: underlayIP(i),
		VTEPIP:     vtepIP(i),
		VTEPMAC:    vtepMAC(i),
		Subnets:    []netip.Prefix{subnet(i)},
	}
}

// desiredFor is agent self's desired state with peers others.
func desiredFor(self int, others ...int) vxlan.Desired {
	d := vxlan.Desired{
		VTEP: vxlan.VTEP{
			Name: vtepName, VNI: 1024, Port: 4789, Local: underlayIP(self),
			MAC: vtepMAC(self), MTU: 1450, Address: netip.PrefixFrom(vtepIP(self), 16),
		},
		Bridges: []vxlan.Bridge{{
			Name:    "m-carve",
			Gateway: netip.PrefixFrom(subnet(self).Addr().Next(), 25),
			MTU:     1420,
		}},
		IPForward: true,
	}
	for _, o := range others {
		d.Peers = append(d.Peers, peer(o))
	}
	return d
}

// desiredN is agent 1 with peers 2..n+1.
func desiredN(n int) vxlan.Desired {
	others := make([]int, n)
	for i := range others {
		others[i] = i + 2
	}
	return desiredFor(1, others...)
}

// kstate is the kernel's carve-relevant state, read with the netlink library.
type kstate struct {
	vtepIndex int
	neigh     map[netip.Addr]string // permanent neighbours on the VTEP
	fdb       map[string]string     // permanent self FDB entries on the VTEP, "mac" -> "dst[,dst]"
	routes    map[netip.Prefix]string
}

func readKernel(t *testing.T, nh *netlink.Handle) kstate {
	t.Helper()
	l, err := nh.LinkByName(vtepName)
	if err != nil {
		t.Fatalf("VTEP: %v", err)
	}
	idx := l.Attrs().Index
	ks := kstate{vtepIndex: idx, neigh: map[netip.Addr]string{}, fdb: map[string]string{}, routes: map[netip.Prefix]string{}}
	neighs, err := nh.NeighList(idx, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT == 0 || n.LinkIndex != idx {
			continue
		}
		a, _ := netip.AddrFromSlice(n.IP)
		ks.neigh[a.Unmap()] = n.HardwareAddr.String()
	}
	fdb, err := nh.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range fdb {
		if n.Flags&netlink.NTF_SELF == 0 || n.LinkIndex != idx || n.State&netlink.NUD_PERMANENT == 0 {
			continue
		}
		k := n.HardwareAddr.String()
		if ks.fdb[k] != "" {
			ks.fdb[k] += ","
		}
		ks.fdb[k] += n.IP.String()
	}
	routes, err := nh.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: vxlan.Protocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		p, _ := netip.ParsePrefix(r.Dst.String())
		onlink := ""
		if r.Flags&int(netlink.FLAG_ONLINK) != 0 {
			onlink = " onlink"
		}
		dev := "?"
		if l, err := nh.LinkByIndex(r.LinkIndex); err == nil {
			dev = l.Attrs().Name
		}
		if _, dup := ks.routes[p]; dup {
			ks.routes[p] += " AND A SECOND ROUTE"
			continue
		}
		ks.routes[p] = fmt.Sprintf("via %s dev %s%s metric %d", r.Gw, dev, onlink, r.Priority)
	}
	return ks
}

// expect is the state DESIGN.md asks for, computed independently of the
// package.
func expect(d vxlan.Desired) kstate { return expectRouted(d, nil, "") }

// expectRouted is expect with the peers in routed reached through the
// underlay device dev: their IPv4 subnets via their underlay IP, and
// neither neighbour nor FDB entry unless they have IPv6 subnets.
func expectRouted(d vxlan.Desired, routed map[string]bool, dev string) kstate {
	ks := kstate{neigh: map[netip.Addr]string{}, fdb: map[string]string{}, routes: map[netip.Prefix]string{}}
	for _, p := range d.Peers {
		if !p.UnderlayIP.IsValid() {
			continue
		}
		if routed[p.ID] {
			v6 := false
			for _, s := range p.Subnets {
				if s.Addr().Is4() {
					ks.routes[s] = fmt.Sprintf("via %s dev %s onlink metric %d", p.UnderlayIP, dev, metric(p.UnderlayIP))
					continue
				}
				v6 = true
				ll := vxlan.LinkLocal(p.VTEPMAC)
				ks.neigh[ll] = p.VTEPMAC.String()
				ks.routes[s] = fmt.Sprintf("via %s dev %s metric %d", ll, vtepName, metric(ll))
			}
			if v6 {
				ks.neigh[p.VTEPIP] = p.VTEPMAC.String()
				if p.VTEPIP6.IsValid() {
					ks.neigh[p.VTEPIP6] = p.VTEPMAC.String()
				}
				ks.fdb[p.VTEPMAC.String()] = p.UnderlayIP.String()
			}
			continue
		}
		ks.neigh[p.VTEPIP] = p.VTEPMAC.String()
		if p.VTEPIP6.IsValid() {
			ks.neigh[p.VTEPIP6] = p.VTEPMAC.String()
		}
		ks.fdb[p.VTEPMAC.String()] = p.UnderlayIP.String()
		for _, s := range p.Subnets {
			if s.Addr().Is4() {
				ks.routes[s] = fmt.Sprintf("via %s dev %s onlink metric %d", p.VTEPIP, vtepName, metric(p.VTEPIP))
			} else {
				ll := vxlan.LinkLocal(p.VTEPMAC)
				ks.neigh[ll] = p.VTEPMAC.String()
				ks.routes[s] = fmt.Sprintf("via %s dev %s metric %d", ll, vtepName, metric(ll))
			}
		}
	}
	return ks
}

// metric is 1024 plus the low 16 bits of the next hop.
func metric(via netip.Addr) int {
	b := via.AsSlice()
	return 1024 + int(b[len(b)-2])<<8 + int(b[len(b)-1])
}

// assertKernel compares the kernel to what d asks for.
func assertKernel(t *testing.T, nh *netlink.Handle, d vxlan.Desired) kstate {
	t.Helper()
	got, want := readKernel(t, nh), expect(d)
	diffMaps(t, "neighbour", got.neigh, want.neigh)
	diffMaps(t, "fdb", got.fdb, want.fdb)
	diffMaps(t, "route", got.routes, want.routes)
	return got
}

func diffMaps[K comparable, V comparable](t *testing.T, what string, got, want map[K]V) {
	t.Helper()
	n := 0
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			if n++; n <= 5 {
				t.Errorf("%s %v: kernel has %v (present %v), want %v", what, k, g, ok, w)
			}
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			if n++; n <= 5 {
				t.Errorf("%s %v: kernel has %v, not desired", what, k, g)
			}
		}
	}
	if n > 5 {
		t.Errorf("%s: %d differences in all", what, n)
	}
}

func apply(t *testing.T, dp *vxlan.Dataplane, d vxlan.Desired) vxlan.Report {
	t.Helper()
	rep, err := dp.Apply(context.Background(), d)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return rep
}

func resync(t *testing.T, dp *vxlan.Dataplane, d vxlan.Desired) vxlan.Report {
	t.Helper()
	rep, err := dp.Resync(context.Background(), d)
	if err != nil {
		t.Fatalf("Resync: %v", err)
	}
	return rep
}

func assertNoChange(t *testing.T, what string, rep vxlan.Report) {
	t.Helper()
	if rep.Changes() != 0 || len(rep.Errors) != 0 {
		t.Fatalf("%s changed %d things (%+v), errors %v; want none", what, rep.Changes(), rep, rep.Errors)
	}
}

// watch records every netlink notification about links, neighbours (incl.
// FDB) and routes in the namespace, to prove that a reconcile touched nothing.
type watch struct {
	host   *netnslab.Host
	nl     *netlink.Handle
	links  chan netlink.LinkUpdate
	neighs chan netlink.NeighUpdate
	routes chan netlink.RouteUpdate
	done   chan struct{}
}

func newWatch(t *testing.T, h *netnslab.Host) *watch {
	t.Helper()
	nh, err := h.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	w := &watch{
		host:   h,
		nl:     nh,
		links:  make(chan netlink.LinkUpdate, 10000),
		neighs: make(chan netlink.NeighUpdate, 10000),
		routes: make(chan netlink.RouteUpdate, 10000),
		done:   make(chan struct{}),
	}
	ns := h.NsHandle()
	if err := netlink.LinkSubscribeWithOptions(w.links, w.done, netlink.LinkSubscribeOptions{Namespace: &ns}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.NeighSubscribeWithOptions(w.neighs, w.done, netlink.NeighSubscribeOptions{Namespace: &ns}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.RouteSubscribeWithOptions(w.routes, w.done, netlink.RouteSubscribeOptions{Namespace: &ns}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.stop)
	return w
}

func (w *watch) stop() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
}

// The markers assertQuiet changes: a bridge, and a neighbour and a
// route on the host's underlay link, all inside the host's namespace.
const markerLink = "quiet0"

var (
	markerNeigh = net.ParseIP("198.19.255.254")
	markerRoute = &net.IPNet{IP: net.ParseIP("198.19.255.0").To4(), Mask: net.CIDRMask(24, 32)}
)

// assertQuiet fails on any notification since the watch began (or since
// the last assertQuiet) but the kernel's own bookkeeping. It does not wait
// for late notifications by sleeping: it changes a marker on each stream
// and reads up to the marker's notification. Netlink delivers a socket's
// notifications in order, so every notification of a change made before
// the marker has arrived by then.
func (w *watch) assertQuiet(t *testing.T) {
	t.Helper()
	uplink, err := w.nl.LinkByName(w.host.Link)
	if err != nil {
		t.Fatal(err)
	}
	must(t, w.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: markerLink}}))
	marker, err := w.nl.LinkByName(markerLink)
	if err != nil {
		t.Fatal(err)
	}
	neigh := &netlink.Neigh{LinkIndex: uplink.Attrs().Index, IP: markerNeigh, HardwareAddr: mustMAC("02:00:00:00:ff:fe"), State: netlink.NUD_PERMANENT}
	must(t, w.nl.NeighAdd(neigh))
	route := &netlink.Route{LinkIndex: uplink.Attrs().Index, Dst: markerRoute}
	must(t, w.nl.RouteAdd(route))
	defer func() {
		must(t, w.nl.RouteDel(route))
		must(t, w.nl.NeighDel(neigh))
		must(t, w.nl.LinkDel(marker))
	}()
	deadline := time.After(testutil.WaitLimit)
	for seen := false; !seen; {
		select {
		case u := <-w.links:
			switch {
			case u.Link.Attrs().Name == markerLink:
				seen = u.Header.Type == unix.RTM_NEWLINK
			case u.Family == unix.AF_INET6:
				// IPv6 per-link state (address autoconfiguration)
			default:
				t.Fatalf("link notification: type %d %s", u.Header.Type, u.Link.Attrs().Name)
			}
		case <-deadline:
			t.Fatal("the marker link's notification never came")
		}
	}
	for seen := false; !seen; {
		select {
		case u := <-w.neighs:
			switch {
			case u.IP.Equal(markerNeigh):
				seen = u.Type == unix.RTM_NEWNEIGH
			case u.LinkIndex == marker.Attrs().Index:
				// the marker bridge's own FDB entry
			case u.Type == unix.RTM_NEWNEIGH && u.State&netlink.NUD_PERMANENT == 0:
				// neighbour state machine of unrelated dynamic entries
			default:
				t.Fatalf("neighbour notification: type %d %s", u.Type, u.String())
			}
		case <-deadline:
			t.Fatal("the marker neighbour's notification never came")
		}
	}
	for seen := false; !seen; {
		select {
		case u := <-w.routes:
			switch {
			case u.Route.Dst != nil && u.Route.Dst.String() == markerRoute.String():
				seen = u.Type == unix.RTM_NEWROUTE
			case u.Route.Protocol == unix.RTPROT_KERNEL:
				// e.g. link-local routes once IPv6 autoconfiguration is done
			default:
				t.Fatalf("route notification: type %d %s", u.Type, u.Route.String())
			}
		case <-deadline:
			t.Fatal("the marker route's notification never came")
		}
	}
}

func assertAddrs(t *testing.T, nh *netlink.Handle, link string, want ...string) {
	t.Helper()
	l, err := nh.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := nh.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range addrs {
		if a.Scope == unix.RT_SCOPE_UNIVERSE {
			got = append(got, a.IPNet.String())
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("addresses of %s = %v, want %v", link, got, want)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
