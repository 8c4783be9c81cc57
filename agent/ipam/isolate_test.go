package ipam

import (
	"context"
	"net/netip"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestMastersTakingSpaceInUseIsolatesIt (issue 26, item 1): the masters'
// records give another agent part of this agent's space where a container
// holds an address (a restore that took a block back, a lease moved). The
// agent takes the records, isolates exactly that address (the container
// keeps it, the metric and the log say so) and goes on serving the rest of
// the overlay. Before, the ring refused the masters' leases and every ADD
// of the overlay failed not_ready, for good.
func TestMastersTakingSpaceInUseIsolatesIt(t *testing.T) {
	h := newHarness(t, t.TempDir(), harnessOptions{})
	victim := h.alloc("victim", "eth0", api.BridgeMesos)
	addr := netip.MustParsePrefix(victim.IPs[0].Address).Addr()
	taken := netip.MustParsePrefix("10.128.2.0/25")
	if !taken.Contains(addr) {
		t.Fatalf("the first container got %s, outside %s: adjust the test", addr, taken)
	}
	v := testView(testSelf())
	v.Peers[1] = Peer{ID: "other", Version: 20, Subnets: []string{"10.128.4.0/23", "fd00:0:0:2::/64", taken.String()}}
	h.svc.Sync(v)

	got, err := h.client.Lookup(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: "victim", IfName: "eth0"})
	if err != nil || got.IPs[0].Address != victim.IPs[0].Address {
		t.Errorf("the isolated container's address: %+v %v, want %s kept", got, err, victim.IPs[0].Address)
	}
	if n, _ := h.gauge("carve_agent_ipam_isolated_addresses", map[string]string{"overlay": "carve"}); n != 1 {
		t.Errorf("carve_agent_ipam_isolated_addresses = %v, want 1", n)
	}
	for _, tc := range []struct{ cid, bridge string }{{"fresh-m", api.BridgeMesos}, {"fresh-d", api.BridgeDocker}} {
		a, err := h.client.Allocate(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: tc.cid, IfName: "eth0", Bridge: tc.bridge})
		if err != nil {
			t.Fatalf("an ADD on the %s bridge after the masters took %s: %v (the overlay must keep serving)", tc.bridge, taken, err)
		}
		for _, ip := range a.IPs {
			if p := netip.MustParsePrefix(ip.Address); taken.Contains(p.Addr()) {
				t.Errorf("an ADD got %s, inside the space the masters took", ip.Address)
			}
		}
	}
	if _, err := h.client.Release(context.Background(), api.IPAMRequest{Network: "carve", ContainerID: "victim", IfName: "eth0"}); err != nil {
		t.Errorf("releasing the isolated container: %v", err)
	}
	h.svc.Sync(v)
	if n, _ := h.gauge("carve_agent_ipam_isolated_addresses", map[string]string{"overlay": "carve"}); n != 0 {
		t.Errorf("after its release, carve_agent_ipam_isolated_addresses = %v, want 0", n)
	}
}
