package vxlan_test

import (
	"net/netip"
	"testing"

	"github.com/carve-net/carve/vxlan"
)

// TestBridgeProxyARP: carve's bridges answer ARP for the addresses they
// route elsewhere (net.ipv4.conf.<bridge>.proxy_arp=1), so that a donor's
// containers reach a block it granted away inside their own prefix (the
// kernel routes the granted block out of the VTEP; the containers, for
// which it is on-link, ARP for it on the bridge). The setting is read back
// in the namespace, restored by a resync after something turned it off,
// and goes away with the bridge.
func TestBridgeProxyARP(t *testing.T) {
	e := newEnv(t)
	d := desiredN(1)
	d.Bridges = []vxlan.Bridge{
		{Name: "m-carve", Gateway: netip.MustParsePrefix("10.128.1.1/28"), Extra: []netip.Prefix{netip.MustParsePrefix("10.128.1.225/27")}, MTU: 1420},
		{Name: "d-carve", Gateway: netip.MustParsePrefix("10.128.1.129/25"), MTU: 1420},
	}
	apply(t, e.dp, d)
	proxyARP := func(link string) string {
		t.Helper()
		v, err := e.host.Sysctl("net.ipv4.conf." + link + ".proxy_arp")
		if err != nil {
			return "error: " + err.Error()
		}
		return v
	}
	for _, link := range []string{"m-carve", "d-carve"} {
		if v := proxyARP(link); v != "1" {
			t.Errorf("proxy_arp on %s = %s, want 1", link, v)
		}
	}
	// Only carve's bridges: the VTEP keeps the kernel's default.
	if v := proxyARP(vtepName); v != "0" {
		t.Errorf("proxy_arp on the VTEP %s = %s, want 0 (untouched)", vtepName, v)
	}
	assertNoChange(t, "Resync", resync(t, e.dp, d))

	// Something turned it off: the resync puts it back, and counts it.
	must(t, e.host.SetSysctl("net.ipv4.conf.m-carve.proxy_arp", "0"))
	rep := resync(t, e.dp, d)
	if rep.Sysctls.Updated != 1 {
		t.Errorf("resync after proxy_arp was turned off: sysctls %+v, want 1 updated", rep.Sysctls)
	}
	if v := proxyARP("m-carve"); v != "1" {
		t.Errorf("proxy_arp on m-carve after the resync = %s, want 1", v)
	}

	// A bridge no longer desired goes, and its setting with it.
	d.Bridges = d.Bridges[:1]
	apply(t, e.dp, d)
	if v, err := e.host.Sysctl("net.ipv4.conf.d-carve.proxy_arp"); err == nil {
		t.Errorf("d-carve removed, yet net.ipv4.conf.d-carve.proxy_arp reads %s", v)
	}
	if v := proxyARP("m-carve"); v != "1" {
		t.Errorf("proxy_arp on m-carve = %s, want 1", v)
	}
}
