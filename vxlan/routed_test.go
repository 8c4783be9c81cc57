package vxlan_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
	"github.com/carve-net/carve/vxlan"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// farPeer is a peer whose underlay IP is outside a /24 around the lab's
// hosts (198.18.0.0/24) but inside the lab's 198.18.0.0/15.
func farPeer(i int) vxlan.Peer {
	p := peer(i)
	p.UnderlayIP = netip.AddrFrom4([4]byte{198, 18, 1, byte(i)})
	return p
}

// narrowUnderlay gives the host's underlay address a /24 instead of the
// lab's /15, so that a segment holds only 198.18.0.0/24.
func narrowUnderlay(t *testing.T, e *env) {
	t.Helper()
	l, err := e.nl.LinkByName(e.host.Link)
	if err != nil {
		t.Fatal(err)
	}
	must(t, e.nl.AddrDel(l, &netlink.Addr{IPNet: ipNet(e.host.IP)}))
	must(t, e.nl.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(e.host.IP.Addr(), 24))}))
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func routedIDs(ids ...int) map[string]bool {
	m := map[string]bool{}
	for _, i := range ids {
		m[peer(i).ID] = true
	}
	return m
}

// TestRoutedEntries programs routed mode and reads the kernel back with
// the netlink library: a peer on the segment has its IPv4 subnets routed
// via its underlay IP on the underlay device and no VTEP entries; a peer
// off the segment stays on VXLAN; a resync finds nothing to fix.
func TestRoutedEntries(t *testing.T) {
	cases := []struct {
		name   string
		narrow bool // the host's underlay address is a /24
		desire func() vxlan.Desired
		routed map[string]bool
	}{
		{"all on the segment", false, func() vxlan.Desired { d := desiredFor(1, 2, 3); d.Routed = true; return d }, routedIDs(2, 3)},
		{"routed off", false, func() vxlan.Desired { return desiredFor(1, 2, 3) }, nil},
		{"one peer off the segment", true, func() vxlan.Desired {
			d := desiredFor(1, 2)
			d.Peers = append(d.Peers, farPeer(3))
			d.Routed = true
			return d
		}, routedIDs(2)},
		{"declared segment", true, func() vxlan.Desired {
			d := desiredFor(1, 2)
			d.Peers = append(d.Peers, farPeer(3))
			d.Routed = true
			d.Segments = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/23")}
			return d
		}, routedIDs(2, 3)},
		{"declared segment without this host", true, func() vxlan.Desired {
			d := desiredFor(1, 2)
			d.Peers = append(d.Peers, farPeer(3))
			d.Routed = true
			d.Segments = []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}
			return d
		}, routedIDs(2)},
		{"IPv6 VTEP addresses, IPv4 subnets only: no VTEP entry", false, func() vxlan.Desired {
			d := desiredFor(1, 2, 3)
			d.VTEP.Address6 = netip.MustParsePrefix("fd01:a::1/64")
			for i := range d.Peers {
				d.Peers[i].VTEPIP6 = netip.MustParseAddr(fmt.Sprintf("fd01:a::%d", i+2))
			}
			d.Routed = true
			return d
		}, routedIDs(2, 3)},
		{"dual stack: IPv6 stays on VXLAN", false, func() vxlan.Desired {
			d := dualStack(1, 2, 3)
			d.Routed = true
			return d
		}, routedIDs(2, 3)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.narrow {
				narrowUnderlay(t, e)
			}
			// Strict reverse path filtering everywhere, the VTEP to come too.
			for _, s := range []string{"all", "default", e.host.Link} {
				must(t, e.host.SetSysctl("net.ipv4.conf."+s+".rp_filter", "1"))
			}
			d := tc.desire()
			rep := apply(t, e.dp, d)
			for _, p := range d.Peers {
				want := vxlan.ModeVXLAN
				if tc.routed[p.ID] {
					want = vxlan.ModeRouted
				}
				if got := rep.Modes[p.ID]; got != want {
					t.Errorf("peer %s: mode %q, want %q", p.ID, got, want)
				}
			}
			if got := rep.PeersByMode()[vxlan.ModeRouted]; got != len(tc.routed) {
				t.Errorf("%d routed peers reported, want %d", got, len(tc.routed))
			}
			got, want := readKernel(t, e.nl), expectRouted(d, tc.routed, e.host.Link)
			diffMaps(t, "neighbour", got.neigh, want.neigh)
			diffMaps(t, "fdb", got.fdb, want.fdb)
			diffMaps(t, "route", got.routes, want.routes)
			assertNoChange(t, "Resync", resync(t, e.dp, d))
			if len(tc.routed) > 0 {
				for _, dev := range []string{e.host.Link, vtepName} {
					if v := sysctl(t, e.host, "net.ipv4.conf."+dev+".rp_filter"); v == "1" {
						t.Errorf("rp_filter of %s is strict (1) with routed peers", dev)
					}
				}
			}
		})
	}
}

// TestRoutedSwitch switches the peers between VXLAN and routed mode both
// ways with incremental Applies: after each the kernel matches, a resync
// finds nothing to fix, and the route notifications show make before
// break: for every prefix the new route is added before the old one is
// deleted, so the prefix is never without a route.
func TestRoutedSwitch(t *testing.T) {
	vx := desiredFor(1, 2, 3, 4)
	routed := vx
	routed.Routed = true
	steps := []struct {
		name   string
		d      vxlan.Desired
		routed map[string]bool
	}{
		{"to routed", routed, routedIDs(2, 3, 4)},
		{"back to vxlan", vx, nil},
		{"to routed again", routed, routedIDs(2, 3, 4)},
	}
	e := newEnv(t)
	apply(t, e.dp, vx)
	assertKernel(t, e.nl, vx)
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			events := make(chan netlink.RouteUpdate, 1000)
			done := make(chan struct{})
			ns := e.host.NsHandle()
			if err := netlink.RouteSubscribeWithOptions(events, done, netlink.RouteSubscribeOptions{Namespace: &ns}); err != nil {
				t.Fatal(err)
			}
			defer close(done)
			rep := apply(t, e.dp, st.d)
			if rep.Full {
				t.Error("the switch read the kernel back; want an incremental Apply")
			}
			if rep.Routes.Updated != 3 || rep.Routes.Added != 0 || rep.Routes.Removed != 0 {
				t.Errorf("routes %+v, want 3 updated", rep.Routes)
			}
			got, want := readKernel(t, e.nl), expectRouted(st.d, st.routed, e.host.Link)
			diffMaps(t, "neighbour", got.neigh, want.neigh)
			diffMaps(t, "fdb", got.fdb, want.fdb)
			diffMaps(t, "route", got.routes, want.routes)
			assertNoChange(t, "Resync after the switch", resync(t, e.dp, st.d))
			// Every subnet: its first notification is the new route's.
			first := map[netip.Prefix]uint16{}
			dels := 0
			for dels < 3 {
				select {
				case u := <-events:
					if u.Route.Protocol != vxlan.Protocol || u.Route.Dst == nil {
						continue
					}
					p, _ := netip.ParsePrefix(u.Route.Dst.String())
					if _, ok := first[p]; !ok {
						first[p] = u.Type
					}
					if u.Type == unix.RTM_DELROUTE {
						dels++
					}
				case <-time.After(testutil.WaitLimit):
					t.Fatalf("only %d route deletions notified, want 3", dels)
				}
			}
			for p, typ := range first {
				if typ != unix.RTM_NEWROUTE {
					t.Errorf("%s: the old route went before the new one came (break before make)", p)
				}
			}
		})
	}
}

// TestRoutedRepair: a resync puts back a routed route deleted by hand, and
// one moved by hand onto the VTEP.
func TestRoutedRepair(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, e *env, r *netlink.Route)
	}{
		{"deleted", func(t *testing.T, e *env, r *netlink.Route) { must(t, e.nl.RouteDel(r)) }},
		{"moved to the VTEP", func(t *testing.T, e *env, r *netlink.Route) {
			vtep, err := e.nl.LinkByName(vtepName)
			if err != nil {
				t.Fatal(err)
			}
			r.LinkIndex = vtep.Attrs().Index
			must(t, e.nl.RouteReplace(r))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			d := desiredFor(1, 2, 3)
			d.Routed = true
			apply(t, e.dp, d)
			rs, err := e.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipNet(subnet(2)), Protocol: vxlan.Protocol},
				netlink.RT_FILTER_DST|netlink.RT_FILTER_PROTOCOL)
			if err != nil || len(rs) != 1 {
				t.Fatalf("routes to %s: %v %v", subnet(2), rs, err)
			}
			tc.damage(t, e, &rs[0])
			rep := resync(t, e.dp, d)
			if rep.Routes.Changes() != 1 {
				t.Errorf("resync made %+v route changes, want 1", rep.Routes)
			}
			got, want := readKernel(t, e.nl), expectRouted(d, routedIDs(2, 3), e.host.Link)
			diffMaps(t, "route", got.routes, want.routes)
			diffMaps(t, "neighbour", got.neigh, want.neigh)
			diffMaps(t, "fdb", got.fdb, want.fdb)
		})
	}
}

// TestRoutedTraffic: containers on two hosts of one segment ping each other
// in routed mode without a packet through the VTEP, and again after
// switching to VXLAN and back.
func TestRoutedTraffic(t *testing.T) {
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 2})
	hosts := lab.Hosts()
	envs := make([]*env, 2)
	cs := make([]*netnslab.Container, 2)
	desired := make([]vxlan.Desired, 2)
	for i, h := range hosts {
		self, other := i+1, 2-i
		envs[i] = newEnvOn(t, lab, h)
		desired[i] = desiredFor(self, other)
		desired[i].Routed = true
		// Strict reverse path filtering, as many distributions set it:
		// routed mode must cope.
		must(t, h.SetSysctl("net.ipv4.conf.all.rp_filter", "1"))
		must(t, h.SetSysctl("net.ipv4.conf.default.rp_filter", "1"))
		must(t, h.SetSysctl("net.ipv4.conf."+h.Link+".rp_filter", "1"))
		apply(t, envs[i].dp, desired[i])
		gw := desired[i].Bridges[0]
		c, err := lab.AddContainer(h, netnslab.ContainerConfig{
			Bridge: gw.Name, Address: netip.PrefixFrom(gw.Gateway.Addr().Next(), gw.Gateway.Bits()), Gateway: gw.Gateway.Addr(),
		})
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
	}
	vtepTx := func() uint64 {
		t.Helper()
		var n uint64
		for _, e := range envs {
			l, err := e.nl.LinkByName(vtepName)
			if err != nil {
				t.Fatal(err)
			}
			n += l.Attrs().Statistics.TxPackets
		}
		return n
	}
	ping := func(what string) {
		t.Helper()
		for i, a := range cs {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := a.PingRetry(ctx, cs[1-i].Config.Address.Addr(), 3)
			cancel()
			if err != nil {
				t.Fatalf("%s: %s -> %s: %v", what, a.Name, cs[1-i].Config.Address.Addr(), err)
			}
		}
	}
	before := vtepTx()
	ping("routed")
	if after := vtepTx(); after != before {
		t.Errorf("routed mode sent %d packets through the VTEPs, want none", after-before)
	}
	for i := range envs {
		d := desired[i]
		d.Routed = false
		apply(t, envs[i].dp, d)
	}
	before = vtepTx()
	ping("vxlan")
	if vtepTx() == before {
		t.Error("VXLAN mode sent nothing through the VTEPs")
	}
	// Half way through a switch: host 1 routes, host 2 still tunnels. The
	// packets come in on the underlay device at host 2 and on the VTEP at
	// host 1, from subnets routed the other way: loose reverse path
	// filtering lets them in.
	apply(t, envs[0].dp, desired[0])
	ping("host 1 routed, host 2 on VXLAN")
	apply(t, envs[1].dp, desired[1])
	ping("routed again")
}
