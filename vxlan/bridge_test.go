package vxlan_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/carve-net/carve/vxlan"
	"github.com/vishvananda/netlink"
)

func TestBridges(t *testing.T) {
	e := newEnv(t)
	// A pre-existing bridge with the desired name is adopted.
	must(t, e.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "m-carve"}}))
	d := desiredN(1)
	d.Bridges = []vxlan.Bridge{
		{Name: "m-carve", Gateway: netip.MustParsePrefix("10.128.1.1/25"), Gateway6: netip.MustParsePrefix("fd00:1::1/80"), MTU: 1420},
		{Name: "d-carve", Gateway: netip.MustParsePrefix("10.128.1.129/25"), MTU: 1420},
	}
	d.IPv6Forward = true
	rep := apply(t, e.dp, d)
	if rep.Bridges.Added != 1 || rep.Bridges.Updated != 1 {
		t.Errorf("bridges %+v, want 1 added 1 updated (adopted)", rep.Bridges)
	}
	assertAddrs(t, e.nl, "m-carve", "10.128.1.1/25", "fd00:1::1/80")
	assertAddrs(t, e.nl, "d-carve", "10.128.1.129/25")
	for _, link := range []string{vtepName, "m-carve", "d-carve"} {
		if v, _ := e.host.Sysctl("net.ipv6.conf." + link + ".forwarding"); v != "1" {
			t.Errorf("ipv6 forwarding on %s = %s", link, v)
		}
	}
	if v, _ := e.host.Sysctl("net.ipv6.conf.m-carve.accept_dad"); v != "0" {
		t.Errorf("accept_dad on the IPv6 gateway bridge = %s, want 0", v)
	}
	assertNoChange(t, "Resync", resync(t, e.dp, d))

	// The MAC of a created or adopted bridge is pinned: ports with lower
	// MACs (container veths) come and go without changing it.
	for i, name := range []string{"m-carve", "d-carve"} {
		br, err := e.nl.LinkByName(name)
		must(t, err)
		before := br.Attrs().HardwareAddr.String()
		port := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("port%d", i), HardwareAddr: mustMAC("02:00:00:00:00:01"), MTU: 1420},
			PeerName: fmt.Sprintf("peer%d", i)}
		must(t, e.nl.LinkAdd(port))
		must(t, e.nl.LinkSetMaster(port, br))
		must(t, e.nl.LinkSetUp(port))
		after, err := e.nl.LinkByName(name)
		must(t, err)
		if got := after.Attrs().HardwareAddr.String(); got != before {
			t.Errorf("%s: MAC %s became %s when a port joined", name, before, got)
		}
		must(t, e.nl.LinkDel(port))
	}

	// Gateway change, bridge removal (incremental).
	d.Bridges = []vxlan.Bridge{{Name: "m-carve", Gateway: netip.MustParsePrefix("10.128.1.1/26"), MTU: 1400}}
	rep = apply(t, e.dp, d)
	if rep.Bridges.Removed != 1 || rep.Addresses.Added != 1 || rep.Addresses.Removed != 2 {
		t.Errorf("bridges %+v addresses %+v", rep.Bridges, rep.Addresses)
	}
	assertAddrs(t, e.nl, "m-carve", "10.128.1.1/26")
	if _, err := e.nl.LinkByName("d-carve"); err == nil {
		t.Error("d-carve not removed")
	}
	if br, _ := e.nl.LinkByName("m-carve"); br.Attrs().MTU != 1400 {
		t.Errorf("MTU %d", br.Attrs().MTU)
	}
	assertNoChange(t, "Resync", resync(t, e.dp, d))
}
