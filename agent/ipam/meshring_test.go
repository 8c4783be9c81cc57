//go:build !race

// Real mesh routers over TCP on 127.0.0.1 carrying the ring channel. mesh
// has data races the race detector reports, so this runs only without
// -race (`make test` runs it after the race suite).

package ipam

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/test/lab/meshtest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestMeshRingGossipInProportionToChange: eight agents on real mesh
// routers connected in a cycle (every change crosses up to four hops),
// with 250 more agents in their rings. An allocation reaches every agent
// as a delta relayed hop by hop, and the whole cluster sends less for it
// than one whole ring; an agent cut off while it happens catches up by
// anti-entropy, again for less than a ring.
func TestMeshRingGossipInProportionToChange(t *testing.T) {
	const agents = 8
	var more []Peer
	for i := range 250 {
		more = append(more, Peer{ID: fmt.Sprintf("peer-%03d", i), Version: uint64(100 + i),
			Subnets: []string{fmt.Sprintf("10.128.%d.%d/26", 64+i/4, 64*(i%4))}})
	}
	self := func(i int) *api.AgentInfo {
		a := testSelf()
		a.AgentID, a.Version = fmt.Sprintf("agent-%d", i), uint64(10+i)
		ov := &a.Overlays[0]
		ov.Subnet, ov.Subnet6 = fmt.Sprintf("10.128.%d.0/23", 2*i), fmt.Sprintf("fd00:0:0:%x::/64", i+1)
		ov.MesosBridge = &api.BridgeInfo{Name: "m-carve", IP: fmt.Sprintf("10.128.%d.0/24", 2*i), IP6: fmt.Sprintf("fd00:0:0:%x::/65", i+1)}
		ov.DockerBridge = &api.BridgeInfo{Name: "d-carve", IP: fmt.Sprintf("10.128.%d.0/24", 2*i+1)}
		return a
	}
	view := testView(testSelf())
	view.Peers = more
	for i := range agents {
		view.Peers = append(view.Peers, peerOf(self(i)))
	}
	svcs := make([]*Service, agents)
	sent := make([]*sentBytes, agents)
	mutes := make([]*atomic.Bool, agents)
	addrs := make([]string, agents)
	routers := make([]*gossip.MeshRouter, agents)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for i := range agents {
		id := fmt.Sprintf("agent-%d", i)
		sent[i] = &sentBytes{byKind: map[string]int{}, count: map[string]int{}}
		svc, err := New(Config{AgentID: id, DB: openDB(t, t.TempDir()), Logger: testLogger(), OnSent: sent[i].add})
		if err != nil {
			t.Fatal(err)
		}
		v := view
		v.Self = self(i)
		svc.Sync(v)
		mutes[i] = &atomic.Bool{}
		routers[i], addrs[i] = meshtest.Start(t, id, gossip.MeshConfig{NoDiscovery: true, GossipInterval: 300 * time.Millisecond}, func(r *gossip.MeshRouter) error {
			ch, err := r.Channel(RingChannel, meshtest.Deaf(svc.RingGossip(), mutes[i]))
			svc.UseChannel(ch)
			return err
		})
		go svc.Run(ctx)
		svcs[i] = svc
	}
	// A cycle: every change crosses up to four hops, and one agent cut
	// off leaves the others a path.
	for i := range agents {
		if err := routers[i].Connect(addrs[(i+agents-1)%agents]); err != nil {
			t.Fatal(err)
		}
	}
	converged := func(skip int) func() error {
		return func() error {
			want := svcs[0].Rings()["carve/4"]
			for i, s := range svcs {
				if i != skip && !bytes.Equal(s.Rings()["carve/4"], want) {
					return fmt.Errorf("agent-%d's ring differs from agent-0's", i)
				}
			}
			return nil
		}
	}
	// Every agent's own free counts reach everyone.
	testutil.Eventually(t, time.Minute, "the rings converge around the cycle", converged(-1))
	whole := len(svcs[0].Rings()["carve/4"])
	total := func() (all int, byKind map[string]int) {
		byKind = map[string]int{}
		for _, s := range sent {
			b, _ := s.reset()
			for k, n := range b {
				byKind[k] += n
				all += n
			}
		}
		return all, byKind
	}

	// One allocation: a delta relayed hop by hop.
	total()
	before := svcs[0].Rings()["carve/4"]
	if _, err := svcs[0].Allocate(req("c1")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the allocation's free count reaches every agent", func() error {
		if bytes.Equal(svcs[0].Rings()["carve/4"], before) {
			return fmt.Errorf("agent-0 has not announced its allocation yet")
		}
		return converged(-1)()
	})
	all, byKind := total()
	t.Logf("one allocation: %d bytes in all across %d agents (%v); the ring is %d bytes", all, agents, byKind, whole)
	if byKind["delta"] == 0 {
		t.Error("no delta was broadcast for the allocation")
	}
	if byKind["delta"]+byKind["push"] > whole {
		t.Errorf("one allocation cost %d bytes of ring entries across the cluster (%v), more than one whole ring (%d)", byKind["delta"]+byKind["push"], byKind, whole)
	}

	// An agent in the middle is cut off while another allocates, then
	// catches up by anti-entropy alone.
	mutes[4].Store(true)
	before = svcs[0].Rings()["carve/4"]
	if _, err := svcs[7].Allocate(req("c2")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the others have the allocation without agent-4", func() error {
		if bytes.Equal(svcs[0].Rings()["carve/4"], before) {
			return fmt.Errorf("agent-0 does not have agent-7's allocation yet")
		}
		return converged(4)()
	})
	if bytes.Equal(svcs[4].Rings()["carve/4"], svcs[0].Rings()["carve/4"]) {
		t.Fatal("agent-4 has the allocation while cut off: the test proves nothing")
	}
	total()
	mutes[4].Store(false)
	testutil.Eventually(t, time.Minute, "agent-4 catches up", converged(-1))
	all, byKind = total()
	t.Logf("catching up: %d bytes in all (%v); the ring is %d bytes", all, byKind, whole)
	if byKind["push"] == 0 {
		t.Error("agent-4 caught up without an anti-entropy push")
	}
	if byKind["push"] > whole {
		t.Errorf("catching up one allocation pushed %d bytes, more than one whole ring (%d)", byKind["push"], whole)
	}
}
