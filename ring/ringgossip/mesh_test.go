//go:build !race

// The adapter over real mesh routers on 127.0.0.1. mesh has data races the
// race detector reports, so this runs only without -race.

package ringgossip

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/internal/testutil"
	"github.com/carve-net/carve/ring"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestOverMesh(t *testing.T) {
	const count = 3
	var peers []*Peer
	var routers []*gossip.MeshRouter
	var addrs []string
	for i := range count {
		id := fmt.Sprintf("agent-%d", i)
		for attempt := 0; ; attempt++ {
			port := freePort(t)
			r, err := gossip.NewMeshRouter(gossip.MeshConfig{ID: id, Host: "127.0.0.1", Port: port, GossipInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			p := newPeer(t, r, uint64(i+1))
			if err := r.Start(); err != nil {
				if attempt < 5 {
					continue
				}
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Stop() })
			peers, routers = append(peers, p), append(routers, r)
			addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", port))
			break
		}
		if i > 0 {
			if err := routers[i].Connect(addrs[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
	testutil.Eventually(t, 0, "mesh formed", testutil.True(func() bool {
		for _, r := range routers {
			if len(r.Peers()) != count-1 {
				return false
			}
		}
		return true
	}))
	// Each agent learns only its own lease; gossip spreads the rest.
	// agent-0's lease is a /30, which it fills.
	for i, p := range peers {
		bits := 24
		if i == 0 {
			bits = 30
		}
		l := lease(p.self, i+1, bits, uint64(i+1))
		if err := p.Update(func(a *ring.Allocator) error { _, err := a.Seed([]ring.Lease{l}, nil); return err }); err != nil {
			t.Fatal(err)
		}
	}
	same := func() bool {
		first := encoded(peers[0])
		for _, p := range peers[1:] {
			if !bytes.Equal(encoded(p), first) {
				return false
			}
		}
		return true
	}
	testutil.Eventually(t, 0, "rings converge", testutil.True(same))
	if err := peers[0].Update(func(a *ring.Allocator) error {
		for x := netip.MustParseAddr("10.128.1.0"); x.Compare(netip.MustParseAddr("10.128.1.3")) <= 0; x = x.Next() {
			if err := a.Reserve(x); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got, err := peers[0].RequestSpace(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "rings converge after the grant", testutil.True(same))
	for _, p := range peers {
		p.View(func(a *ring.Allocator) {
			if o, _ := a.Ring().Owner(got.Addr()); o != "agent-0" {
				t.Fatalf("%s: %v belongs to %q", a.Self(), got, o)
			}
		})
	}
	checkDisjoint(t, 0, peers)
}
