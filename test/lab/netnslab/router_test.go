package netnslab

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestRouter: host 1 behind a router on its own /31, hosts 2 and 3 on a
// /31 of the bridge: every host reaches every other, the ones on the /31
// directly and host 1 through the router, and the underlay namespace
// reaches them all (proxy ARP for host 1).
func TestRouter(t *testing.T) {
	lab := ForTest(t, Options{Hosts: 3})
	h := lab.Hosts()
	r, err := lab.AddRouter(netip.MustParsePrefix("198.18.1.1/15"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.MoveBehind(h[0], 31); err != nil {
		t.Fatal(err)
	}
	for _, x := range h[1:] {
		if err := r.NarrowSegment(x, 31); err != nil {
			t.Fatal(err)
		}
	}
	nh, err := h[1].Netlink()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		to     netip.Addr
		direct bool
	}{{h[2].IP.Addr(), true}, {h[0].IP.Addr(), false}} {
		rs, err := nh.RouteGet(c.to.AsSlice())
		if err != nil || len(rs) != 1 {
			t.Fatalf("route to %s: %v %v", c.to, rs, err)
		}
		if direct := rs[0].Gw == nil; direct != c.direct {
			t.Errorf("host 2's route to %s: gateway %v, want direct %v", c.to, rs[0].Gw, c.direct)
		}
	}
	// The harness's view: an address on the underlay bridge.
	uh, err := lab.Underlay.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	br, err := uh.LinkByName(UnderlayBridge)
	if err != nil {
		t.Fatal(err)
	}
	if err := uh.AddrAdd(br, &netlink.Addr{IPNet: prefixToIPNet(netip.MustParsePrefix("198.18.0.2/15"))}); err != nil {
		t.Fatal(err)
	}
	for _, a := range h {
		mustPing(t, lab.Underlay, a.IP.Addr())
		for _, b := range h {
			if a != b {
				mustPing(t, a.Namespace, b.IP.Addr())
			}
		}
		mustPing(t, r.Namespace, a.IP.Addr())
	}
}
