package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// reachBound bounds the wait for a new container to answer a ping from
// another host. With the host's neighbour entry of a freed address left
// behind, the new container is unreachable for 15-45 s (REACHABLE) plus about
// 8 s (DELAY, PROBE); without it the first echo is answered. The bound sits
// far from both, so the test tells them apart on a loaded machine: it is not
// a measurement.
const reachBound = 5 * time.Second

// TestFreedAddressReuse is issue 28 item 6 on two hosts: container A on h1
// is pinged from a container on h2 (so h1's bridge has a REACHABLE neighbour
// entry naming A's MAC), then deleted, and container B created at once.
//
//  1. Round-robin: B does not get A's address, and is reachable.
//  2. Forced reuse (A's address is the only free one of the bridge's first
//     block): B gets A's address, with a new MAC; h1's bridge keeps no
//     neighbour entry of the address once A's DEL is answered, and B
//     answers a ping from h2 within reachBound.
//
// Before the fix, step 1 fails on B's address (the lowest free was A's) and
// step 2 on the entry left behind, REACHABLE with A's MAC, and on the ping.
func TestFreedAddressReuse(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 2, Masters: 1, Prefix: prefix})
	const overlay = "carve"
	ctx := within(t, 2*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h1, h2 := c.Host(1), c.Host(2)
	peer, err := c.AddCNIContainer(ctx, h2, overlay, labcluster.CNIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nh, err := h1.NS.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	bridge := netconf.MesosBridge(overlay)

	// newPinged creates a container on h1 and pings it from h2: h1 then
	// has a neighbour entry naming its MAC.
	newPinged := func(t *testing.T) *labcluster.Container {
		t.Helper()
		a, err := c.AddCNIContainer(ctx, h1, overlay, labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := peer.NS.PingRetry(ctx, a.Addr.Addr(), 10); err != nil {
			t.Fatalf("%s cannot ping %s: %v", peer, a, err)
		}
		if _, ok := neighbour(t, nh, bridge, a.Addr.Addr()); !ok {
			t.Fatalf("h1 has no neighbour entry of %s after the ping", a)
		}
		return a
	}
	// del deletes a container and checks its address's entry went with it:
	// the DEL is answered once the release is durable, and the entry goes
	// before that.
	del := func(t *testing.T, a *labcluster.Container) {
		t.Helper()
		if err := c.DelCNIContainer(ctx, a); err != nil {
			t.Fatal(err)
		}
		if n, ok := neighbour(t, nh, bridge, a.Addr.Addr()); ok {
			t.Errorf("h1's %s keeps the neighbour entry of the freed %s: %s %s", bridge, a.Addr.Addr(), n.HardwareAddr, neighState(n.State))
		}
	}
	reachable := func(t *testing.T, b *labcluster.Container) {
		t.Helper()
		testutil.Eventually(t, reachBound, fmt.Sprintf("%s to answer %s on h2", b, peer), func() error {
			pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			return peer.NS.Ping(pctx, b.Addr.Addr())
		})
	}

	t.Run("round-robin", func(t *testing.T) {
		a := newPinged(t)
		del(t, a)
		b, err := c.AddCNIContainer(ctx, h1, overlay, labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if b.Addr.Addr() == a.Addr.Addr() {
			t.Fatalf("B got the address A freed a moment ago, %s: allocation should go round-robin", a.Addr.Addr())
		}
		reachable(t, b)
	})

	t.Run("forced reuse", func(t *testing.T) {
		// Fill the bridge's first block but for A's address: allocation
		// tries that block first, so B must get A's address.
		mesos := mesosBridge(ctx, t, c, h1, overlay).Masked()
		a := newPinged(t)
		held := 0
		for _, p := range allocations(ctx, t, c, h1, overlay) {
			if mesos.Contains(p.Addr()) {
				held++
			}
		}
		hosts := 1<<(32-mesos.Bits()) - 3 // not the network, gateway nor broadcast address
		cl := c.IPAMClient(h1)
		for i := range hosts - held {
			alloc, err := cl.Allocate(ctx, api.IPAMRequest{Network: overlay, ContainerID: fmt.Sprint("filler-", i), IfName: "eth0", Bridge: api.BridgeMesos, Family: "4"})
			if err != nil {
				t.Fatalf("filling %s: %v", mesos, err)
			}
			if got := netip.MustParsePrefix(alloc.IPs[0].Address).Addr(); !mesos.Contains(got) {
				t.Fatalf("filling %s: got %s, outside it", mesos, got)
			}
		}
		del(t, a)
		b, err := c.AddCNIContainer(ctx, h1, overlay, labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if b.Addr.Addr() != a.Addr.Addr() {
			t.Fatalf("B got %s, want A's %s, the only free address of %s", b.Addr.Addr(), a.Addr.Addr(), mesos)
		}
		reachable(t, b)
	})
}

// neighbour returns the neighbour entry of addr on the bridge named bridge
// in nh's namespace, if there is one (FAILED and INCOMPLETE entries name no
// MAC and do not count).
func neighbour(t *testing.T, nh *netlink.Handle, bridge string, addr netip.Addr) (netlink.Neigh, bool) {
	t.Helper()
	br, err := nh.LinkByName(bridge)
	if err != nil {
		t.Fatalf("bridge %s: %v", bridge, err)
	}
	neighs, err := nh.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatalf("neighbours of %s: %v", bridge, err)
	}
	for _, n := range neighs {
		if got, ok := netip.AddrFromSlice(n.IP); ok && got.Unmap() == addr && n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) == 0 {
			return n, true
		}
	}
	return netlink.Neigh{}, false
}

// neighState names a neighbour state as ip neigh does.
func neighState(s int) string {
	for _, st := range []struct {
		bit  int
		name string
	}{{netlink.NUD_REACHABLE, "REACHABLE"}, {netlink.NUD_STALE, "STALE"}, {netlink.NUD_DELAY, "DELAY"},
		{netlink.NUD_PROBE, "PROBE"}, {netlink.NUD_PERMANENT, "PERMANENT"}, {netlink.NUD_NOARP, "NOARP"}} {
		if s&st.bit != 0 {
			return st.name
		}
	}
	return fmt.Sprintf("state %#x", s)
}
