package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestQuarantineReleasedByUsageReports deletes an agent while two agents
// run: its space is quarantined until every live agent has sent a complete
// usage report past the deletion. The running agents send them on their
// own (wired to the masters' client), the quarantine is released, and an
// agent registered afterwards is leased the deleted agent's subnet (the
// lowest free slice).
func TestQuarantineReleasedByUsageReports(t *testing.T) {
	for _, tt := range []struct {
		name     string
		interval time.Duration
	}{{"usage reports release it", 100 * time.Millisecond}} {
		t.Run(tt.name, func(t *testing.T) {
			hosts, dir, _ := hostsWithMaster(t, 2)
			_, key := testKey(t)
			m := mastertest.StartSigning(t, filepath.Join(dir, "signing-m1"), state.DefaultConfig(), quietLogger(), key)
			op := masterClient(t, m)
			ctx := context.Background()
			// The deleted agent registers first: it holds the lowest /24.
			ghost, err := op.Register(ctx, api.RegisterRequest{AgentID: "ghost", IP: "198.18.9.1"})
			if err != nil {
				t.Fatal(err)
			}
			ghostSubnet := ghost.Overlays[0].Subnet
			gnet := fakegossip.New(fakegossip.Config{Seed: 91, GossipInterval: 100 * time.Millisecond})
			t.Cleanup(gnet.Close)
			t.Logf("fake gossip seed %d", gnet.Seed())
			interval := tt.interval
			var agents []*runningAgent
			for i, h := range hosts {
				a := newTestAgent(t, h, m.URL(), filepath.Join(dir, fmt.Sprint("a", i)), gnet, func(c *Config) { c.UsageInterval = interval })
				agents = append(agents, runAgent(t, a))
			}
			for _, a := range agents {
				testutil.Eventually(t, 0, "agent "+a.id+" serves its overlay", testutil.True(func() bool { st := a.ipam.Status("carve"); return st != nil && st.Ready }))
			}
			if err := op.DeleteAgent(ctx, "ghost"); err != nil {
				t.Fatal(err)
			}
			if n := m.Table().QuarantinedCount(); n == 0 {
				t.Fatal("the deleted agent's space is not quarantined while agents are live")
			}
			testutil.Eventually(t, 0, "the live agents' usage reports release the quarantine", testutil.True(func() bool {
				return m.Table().QuarantinedCount() == 0
			}))
			late, err := op.Register(ctx, api.RegisterRequest{AgentID: "late", IP: "198.18.9.3"})
			if err != nil {
				t.Fatal(err)
			}
			if got := late.Overlays[0].Subnet; got != ghostSubnet {
				t.Fatalf("new agent leased %s, want the released %s", got, ghostSubnet)
			}
			// The masters show the agents' blocks with counts.
			info, ok := m.Table().Agent(agents[0].id)
			if !ok {
				t.Fatal("agent record missing")
			}
			if bs := info.Overlays[0].Blocks; len(bs) == 0 || bs[0].Free == nil {
				t.Fatalf("the masters show no usage of %s's blocks: %+v", agents[0].id, bs)
			}
			// So does the agent.
			ov := agents[0].Overlay().Overlays[0]
			if len(ov.Blocks) == 0 || ov.Blocks[0].Free == nil || *ov.Blocks[0].Free == 0 {
				t.Fatalf("/overlay-agent/overlay blocks without counts: %+v", ov.Blocks)
			}
		})
	}
}
