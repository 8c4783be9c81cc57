package vxlan_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/vxlan"
)

func subnet6(i int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("fd00:%x::/64", i))
}

// dualStack is agent self's desired state with an IPv6 overlay as well.
func dualStack(self int, others ...int) vxlan.Desired {
	d := desiredFor(self, others...)
	d.Bridges[0].Gateway6 = netip.MustParsePrefix(fmt.Sprintf("fd00:%x::1/80", self))
	d.IPv6Forward = true
	for i, o := range others {
		d.Peers[i].Subnets = append(d.Peers[i].Subnets, subnet6(o))
	}
	return d
}

// TestTraffic programs three hosts on an underlay bridge and pings between
// containers on different hosts, over IPv4 and IPv6, through the overlay.
func TestTraffic(t *testing.T) {
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 3})
	hosts := lab.Hosts()
	ids := []int{1, 2, 3}
	envs := make([]*env, 3)
	containers := make([]*netnslab.Container, 3)
	desired := make([]vxlan.Desired, 3)
	for i, h := range hosts {
		self := ids[i]
		var others []int
		for _, o := range ids {
			if o != self {
				others = append(others, o)
			}
		}
		if h.IP.Addr() != underlayIP(self) {
			t.Fatalf("host %d has underlay %s, want %s", self, h.IP, underlayIP(self))
		}
		envs[i] = newEnvOn(t, lab, h)
		desired[i] = dualStack(self, others...)
		allBefore := sysctl(t, h, "net.ipv6.conf.all.forwarding")
		apply(t, envs[i].dp, desired[i])
		// IPv6 is forwarded with forwarding on carve's interfaces only:
		// the pings below go through the namespace with conf.all as it was.
		if got := sysctl(t, h, "net.ipv6.conf.all.forwarding"); got != allBefore {
			t.Fatalf("host %d: net.ipv6.conf.all.forwarding changed from %s to %s", self, allBefore, got)
		}
		gw := desired[i].Bridges[0]
		c, err := lab.AddContainer(h, netnslab.ContainerConfig{
			Bridge:   gw.Name,
			Address:  netip.PrefixFrom(gw.Gateway.Addr().Next(), gw.Gateway.Bits()),
			Gateway:  gw.Gateway.Addr(),
			Address6: netip.PrefixFrom(gw.Gateway6.Addr().Next(), gw.Gateway6.Bits()),
			Gateway6: gw.Gateway6.Addr(),
		})
		if err != nil {
			t.Fatal(err)
		}
		containers[i] = c
	}
	ping := func(from, to *netnslab.Container, want bool) {
		t.Helper()
		for _, dst := range []netip.Addr{to.Config.Address.Addr(), to.Config.Address6.Addr()} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := from.PingRetry(ctx, dst, 3)
			cancel()
			if want && err != nil {
				t.Errorf("%s -> %s: %v", from.Name, dst, err)
			}
			if !want && err == nil {
				t.Errorf("%s -> %s answered, want no path", from.Name, dst)
			}
		}
	}
	for i, a := range containers {
		for j, b := range containers {
			if i != j {
				ping(a, b, true)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Host 1 forgets host 3: no path from container 1 to container 3 any
	// more (host 3 still knows host 1, the return path is not enough).
	d := dualStack(1, 2)
	apply(t, envs[0].dp, d)
	assertKernel(t, envs[0].nl, d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := containers[0].Ping(ctx, containers[2].Config.Address.Addr()); err == nil {
		t.Error("ping through a removed peer answered")
	}
	ping(containers[0], containers[1], true)
	// Back again.
	apply(t, envs[0].dp, desired[0])
	ping(containers[0], containers[2], true)
}

func sysctl(t *testing.T, h *netnslab.Host, name string) string {
	t.Helper()
	v, err := h.Sysctl(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestIPv6ForwardingOnCarveInterfacesOnly: an IPv6 overlay turns forwarding
// on for the VTEP and the bridges, and leaves net.ipv6.conf.all (which
// would stop every interface, uplinks included, from accepting router
// advertisements) and the other interfaces alone.
func TestIPv6ForwardingOnCarveInterfacesOnly(t *testing.T) {
	e := newEnv(t)
	all, uplink := "net.ipv6.conf.all.forwarding", "net.ipv6.conf."+e.host.Link+".forwarding"
	before := map[string]string{all: sysctl(t, e.host, all), uplink: sysctl(t, e.host, uplink)}
	d := dualStack(1, 2)
	apply(t, e.dp, d)
	for name, was := range before {
		if got := sysctl(t, e.host, name); got != was {
			t.Errorf("%s changed from %s to %s", name, was, got)
		}
	}
	for _, link := range []string{vtepName, d.Bridges[0].Name} {
		if got := sysctl(t, e.host, "net.ipv6.conf."+link+".forwarding"); got != "1" {
			t.Errorf("%s: IPv6 forwarding %s, want 1", link, got)
		}
		if got, err := e.host.Sysctl("net.ipv6.conf." + link + ".force_forwarding"); err == nil && got != "1" {
			t.Errorf("%s: force_forwarding %s, want 1", link, got)
		}
	}
	// Turned off by hand, a resync turns it back on.
	if err := e.host.SetSysctl("net.ipv6.conf."+vtepName+".forwarding", "0"); err != nil {
		t.Fatal(err)
	}
	resync(t, e.dp, d)
	if got := sysctl(t, e.host, "net.ipv6.conf."+vtepName+".forwarding"); got != "1" {
		t.Errorf("after a resync, %s IPv6 forwarding %s, want 1", vtepName, got)
	}
}

// vtepIP6 is agent i's IPv6 VTEP address in DC/OS's default fd01:a::/64.
func vtepIP6(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x01, 3: 0x0a, 14: byte(i >> 8), 15: byte(i)}), 64)
}

// dcos6Subnet is agent i's /80 of DC/OS's IPv6-only overlay fd01:b::/64.
func dcos6Subnet(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x01, 3: 0x0b, 9: byte(i)}), 80)
}

// TestIPv6OnlyOverlayAndVTEPIP6 is DC/OS's default dataplane: an IPv6-only
// overlay (dcos6) beside an IPv4 one, and every VTEP with an IPv6 address
// of vtep_subnet6. The kernel is read back (the VTEP's addresses, a
// permanent neighbour entry per peer's vtep_ip6) and containers on the
// IPv6-only bridges reach each other and the peer's vtep_ip6.
func TestIPv6OnlyOverlayAndVTEPIP6(t *testing.T) {
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 2})
	hosts := lab.Hosts()
	containers := make([]*netnslab.Container, 2)
	for i, h := range hosts {
		self, other := i+1, 2-i
		d := desiredFor(self, other)
		d.VTEP.Address6 = vtepIP6(self)
		d.IPv6Forward = true
		d.Bridges = append(d.Bridges, vxlan.Bridge{Name: "m-dcos6", MTU: 1420,
			Gateway6: netip.PrefixFrom(dcos6Subnet(self).Addr().Next(), 81)})
		d.Peers[0].VTEPIP6 = vtepIP6(other).Addr()
		d.Peers[0].Subnets = append(d.Peers[0].Subnets, dcos6Subnet(other))
		e := newEnvOn(t, lab, h)
		apply(t, e.dp, d)
		assertKernel(t, e.nl, d)
		link, err := e.nl.LinkByName(vtepName)
		if err != nil {
			t.Fatal(err)
		}
		addrs, err := e.nl.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, a := range addrs {
			if p, _ := netip.ParsePrefix(a.IPNet.String()); p == vtepIP6(self) {
				found = true
			}
		}
		if !found {
			t.Errorf("host %d: %s not on the VTEP (addresses %v)", self, vtepIP6(self), addrs)
		}
		// A resync leaves it all in place.
		assertNoChange(t, "resync", resync(t, e.dp, d))
		gw := d.Bridges[1].Gateway6
		c, err := lab.AddContainer(h, netnslab.ContainerConfig{
			Bridge:   "m-dcos6",
			Address:  netip.MustParsePrefix(fmt.Sprintf("192.0.2.%d/32", self)), // unrouted: the overlay is IPv6 only
			Address6: netip.PrefixFrom(gw.Addr().Next(), gw.Bits()),
			Gateway6: gw.Addr(),
		})
		if err != nil {
			t.Fatal(err)
		}
		containers[i] = c
	}
	for i, from := range containers {
		to := containers[1-i]
		for _, dst := range []netip.Addr{to.Config.Address6.Addr(), vtepIP6(2 - i).Addr()} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := from.PingRetry(ctx, dst, 3); err != nil {
				t.Errorf("%s -> %s: %v", from.Name, dst, err)
			}
			cancel()
		}
	}
}
