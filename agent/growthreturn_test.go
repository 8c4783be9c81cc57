package agent

import (
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/ring"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestReturnedBlockStaysReturnedAcrossRestart: an agent gives an idle
// grown block back (its ring lets go of it, the return waits in the
// outbox: the masters cannot commit it now), then restarts. Until the
// return is committed, the masters' record it loads still lists the
// block; yet the block is the masters' to lease again as soon as the
// return lands, so the agent must never hand out an address there again:
// after the restart no ADD may get one, nor may it hold the block again,
// and once the masters take the return their record and its ring drop it.
// Found by TestGrowthInvariantAcrossAgents (seed 210842): an address
// handed out there after a restart, and the block never idle again.
func TestReturnedBlockStaysReturnedAcrossRestart(t *testing.T) {
	testutil.Require(t, netnslab.IsRoot(), "needs root to create network namespaces for the agent")
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: 1})
	dir := t.TempDir()
	_, key := testKey(t)
	cfg := state.DefaultConfig()
	cfg.Overlays = []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/26", Prefix: 28, GrowPrefix: 30}}
	m := mastertest.StartSigning(t, filepath.Join(dir, "m1"), cfg, quietLogger(), key)
	proxy := newMasterProxy(t, m)
	gnet := fakegossip.New(fakegossip.Config{Seed: 1, GossipInterval: 100 * time.Millisecond})
	t.Cleanup(gnet.Close)
	host := lab.Hosts()[0]
	dataDir := filepath.Join(dir, "a0")
	start := func() *runningAgent {
		ra := runAgent(t, newTestAgent(t, host, proxy.URL(), dataDir, gnet, func(c *Config) {
			c.UsageInterval = 200 * time.Millisecond
			c.BlockIdleReturn = time.Second
			c.ResyncInterval = 2 * time.Second
		}))
		testutil.Eventually(t, 0, "the agent serves the overlay", func() error {
			if st := ra.ipam.Status("carve"); st == nil || !st.Ready {
				return fmt.Errorf("IPAM status %+v", st)
			}
			return nil
		})
		return ra
	}
	ra := start()
	add := func(ra *runningAgent, c string) (netip.Addr, error) {
		al, err := ra.IPAM().Allocate(api.IPAMRequest{Network: "carve", ContainerID: c, IfName: "eth0", Bridge: api.BridgeMesos})
		if err != nil {
			return netip.Addr{}, err
		}
		return allocationAddr(al)
	}
	// Fill the mesos bridge's lease until an ADD lands in a grown block.
	var grown netip.Prefix
	var inGrown string
	for i := 0; !grown.IsValid(); i++ {
		if i == 12 {
			t.Fatalf("no ADD landed in a grown block: %+v", ra.ipam.Status("carve"))
		}
		c := fmt.Sprintf("c%d", i)
		addr, err := add(ra, c)
		if err != nil {
			t.Fatalf("ADD %s: %v", c, err)
		}
		for _, b := range ra.ipam.Status("carve").Blocks[api.BridgeMesos] {
			if p := netip.MustParsePrefix(b.Prefix); b.Origin == api.BlockGrown && p.Contains(addr) {
				grown, inGrown = p, c
			}
		}
	}
	// The masters cannot commit returns now; the container in the grown
	// block leaves, and the block goes back (to the outbox).
	proxy.setUnavailable(func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/blocks/return") })
	if _, err := ra.IPAM().Release(api.IPAMRequest{Network: "carve", ContainerID: inGrown, IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the idle grown block goes back", func() error {
		for _, b := range ra.ipam.Status("carve").Blocks[api.BridgeMesos] {
			if b.Prefix == grown.String() {
				return fmt.Errorf("still holds %s", grown)
			}
		}
		return nil
	})
	if !recordLists(t, m, ra.id, grown) {
		t.Fatalf("the masters' record no longer lists %s: the return was committed, the test shows nothing", grown)
	}
	ra.stop(t)
	ra = start()
	// Every ADD now: none in the returned block, which the ring does not
	// give the agent.
	for i := 0; i < 4; i++ {
		c := fmt.Sprintf("after%d", i)
		addr, err := add(ra, c)
		if err != nil {
			if api.IsCode(err, api.CodeExhausted) {
				continue
			}
			t.Fatalf("ADD %s: %v", c, err)
		}
		if grown.Contains(addr) {
			r, _ := ring.Decode(ra.IPAM().Rings()["carve/4"])
			t.Fatalf("ADD %s after the restart got %s, inside %s, which this agent gave back (its return not yet committed)\n%s\nleases %v\nstatus %+v", c, addr, grown, r, r.Leases(), ra.ipam.Status("carve"))
		}
	}
	for bridge, bs := range ra.ipam.Status("carve").Blocks {
		for _, b := range bs {
			if b.Prefix == grown.String() {
				t.Fatalf("after the restart the agent holds the returned %s again (on %s)", grown, bridge)
			}
		}
	}
	// The masters take the return: their record drops the block.
	proxy.setUnavailable(nil)
	testutil.Eventually(t, 0, "the masters take the return, and the agent's ring lets go of the block", func() error {
		if recordLists(t, m, ra.id, grown) {
			return fmt.Errorf("the record still lists %s", grown)
		}
		r, err := ring.Decode(ra.IPAM().Rings()["carve/4"])
		if err != nil {
			return err
		}
		if owner, _ := r.Owner(grown.Addr().Next()); owner == ra.id {
			return fmt.Errorf("the ring still gives %s to the agent: %s", grown, r)
		}
		return nil
	})
}

// recordLists tells whether the masters' record of agent id lists a block
// p.
func recordLists(t *testing.T, m *master.Master, id string, p netip.Prefix) bool {
	t.Helper()
	for _, ag := range masterState(t, m).Agents {
		if ag.AgentID != id {
			continue
		}
		for _, ov := range ag.Overlays {
			for _, b := range ov.Blocks {
				if b.Prefix == p.String() {
					return true
				}
			}
		}
	}
	return false
}
