//go:build !race

// Real mesh routers over TCP on 127.0.0.1 (mesh has data races the race
// detector reports, so these run only without -race).

package gossip_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/test/lab/meshtest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// boundedNode is a router with discovery off, as agents run them.
type boundedNode struct {
	r    *gossip.MeshRouter
	id   string
	addr string
}

var boundedConfig = gossip.MeshConfig{NoDiscovery: true, GossipInterval: 100 * time.Millisecond}

func startBounded(t *testing.T, id string) boundedNode {
	t.Helper()
	r, addr := meshtest.Start(t, id, boundedConfig, func(*gossip.MeshRouter) error { return nil })
	return boundedNode{r: r, id: id, addr: addr}
}

// know checks that every node knows exactly the others, and has at most
// two neighbours (its own dial and the next node's).
func know(nodes []boundedNode) error {
	var all []string
	for _, n := range nodes {
		all = append(all, n.id)
	}
	slices.Sort(all)
	for _, n := range nodes {
		want := slices.DeleteFunc(slices.Clone(all), func(id string) bool { return id == n.id })
		if got := n.r.Peers(); !slices.Equal(got, want) {
			return fmt.Errorf("%s knows %v, want %v", n.id, got, want)
		}
		if nb := n.r.Neighbours(); len(nb) > 2 {
			return fmt.Errorf("%s has neighbours %v", n.id, nb)
		}
	}
	return nil
}

// TestMeshTopologyBounded: agents in a line, each dialling only the
// previous one, learn every other agent through mesh's topology gossip
// (periodic digests, deltas on change); an agent that restarts on its
// address is known again; one that leaves is forgotten.
func TestMeshTopologyBounded(t *testing.T) {
	const n = 6
	var nodes []boundedNode
	for i := range n {
		nodes = append(nodes, startBounded(t, fmt.Sprintf("agent-%d", i)))
		if i > 0 {
			if err := nodes[i].r.Connect(nodes[i-1].addr); err != nil {
				t.Fatal(err)
			}
		}
	}
	testutil.Eventually(t, 0, "the line converges", func() error { return know(nodes) })

	// agent-2 restarts on the same address (which needs the listener
	// closed on Stop): agent-3 keeps dialling it, and the new agent-2
	// dials agent-1 again.
	if err := nodes[2].r.Stop(); err != nil {
		t.Fatal(err)
	}
	cfg := boundedConfig
	cfg.ID, cfg.Host = "agent-2", "127.0.0.1"
	fmt.Sscanf(nodes[2].addr, "127.0.0.1:%d", &cfg.Port)
	r, err := gossip.NewMeshRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatalf("restart on %s: %v", nodes[2].addr, err)
	}
	t.Cleanup(func() { r.Stop() })
	nodes[2].r = r
	if err := r.Connect(nodes[1].addr); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the line reconverges after a restart", func() error { return know(nodes) })

	// agent-5 leaves (it dialled agent-4; nobody dials it).
	if err := nodes[5].r.Stop(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the others forget the agent that left", func() error { return know(nodes[:5]) })
}
