package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/ipam"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestGrowthStopsAtTheMastersQuota: a real agent (in a network namespace)
// fills its mesos bridge on a real master whose overlay caps an agent at a
// /29 of grown and granted space (two grown /30s) with plenty left free.
// It grows twice, then the masters answer 409 quota; it asks no peer for
// space (the masters would refuse the grant's report too): the ADD fails
// with 409 quota naming quota_prefix, and the masters' records show two
// grown blocks of its own and no grant, and its peer's lease whole.
func TestGrowthStopsAtTheMastersQuota(t *testing.T) {
	testutil.Require(t, netnslab.IsRoot(), "needs root to create network namespaces for the agents")
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 2})
	dir := t.TempDir()
	_, key := testKey(t)
	cfg := state.DefaultConfig()
	cfg.Overlays = []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/24", Prefix: 28, GrowPrefix: 30, QuotaPrefix: 29}}
	m := mastertest.StartSigning(t, filepath.Join(dir, "m1"), cfg, quietLogger(), key)
	gnet := fakegossip.New(fakegossip.Config{Seed: 1, GossipInterval: 100 * time.Millisecond})
	t.Cleanup(gnet.Close)
	var agents []*runningAgent
	for i, host := range lab.Hosts() {
		agents = append(agents, runAgent(t, newTestAgent(t, host, m.URL(), filepath.Join(dir, fmt.Sprint("a", i)), gnet)))
	}
	for _, ra := range agents {
		testutil.Eventually(t, 0, ra.id+" serves the overlay", func() error {
			if st := ra.IPAM().Status("carve"); st == nil || !st.Ready {
				return fmt.Errorf("IPAM status %+v", st)
			}
			return nil
		})
	}
	hot, peer := agents[0], agents[1]
	var err error
	added := 0
	for ; added < 64; added++ {
		if _, err = hot.IPAM().Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("c", added), IfName: "eth0", Bridge: api.BridgeMesos}); err != nil {
			break
		}
	}
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeQuota || !strings.Contains(ae.Message, "quota_prefix") {
		t.Fatalf("ADD %d on %s: %v; want 409 quota naming quota_prefix", added, hot.id, err)
	}
	t.Logf("%d ADDs, then: %v", added, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := apiclient.NewClient([]string{m.URL()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cl.Agent(ctx, hot.id)
	if err != nil {
		t.Fatal(err)
	}
	origins := map[string]int{}
	for _, b := range info.Overlay("carve").Blocks {
		origins[b.Origin]++
	}
	if origins[api.BlockGrown] != 2 || origins[api.BlockGranted] != 0 {
		t.Errorf("%s's blocks at the masters: %+v; want two grown /30s and no grant", hot.id, info.Overlay("carve").Blocks)
	}
	other, err := cl.Agent(ctx, peer.id)
	if err != nil {
		t.Fatal(err)
	}
	lease := netip.MustParsePrefix(other.Overlay("carve").Subnet)
	for _, b := range other.Overlay("carve").Blocks {
		if p := netip.MustParsePrefix(b.Prefix); b.Origin == api.BlockLeased && p.Bits() > lease.Bits()+1 {
			t.Errorf("%s's lease was cut: %+v", peer.id, other.Overlay("carve").Blocks)
		}
	}
	// Nor does the agent itself hold a grant the masters were not told of.
	for bridge, bs := range hot.IPAM().Status("carve").Blocks {
		for _, b := range bs {
			if b.Origin == ipam.OriginGrant {
				t.Errorf("%s holds a grant on its %s bridge at its quota: %+v", hot.id, bridge, b)
			}
		}
	}
}
