package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestAgentReclaimsLostIP: when another registration takes the agent's
// underlay IP (an operator's here; an agent's certificate names only its
// own), the masters' record of the agent shows no IP and every host would
// drop its FDB entries and routes; the agent registers again by itself and
// its record carries its IP again, counted once.
func TestAgentReclaimsLostIP(t *testing.T) {
	hosts, dir, m := hostsWithMaster(t, 1)
	gnet := fakegossip.New(fakegossip.Config{Seed: 19})
	t.Cleanup(gnet.Close)
	a := startAgent(t, hosts[0], "http://"+m.HTTPAddr(), filepath.Join(dir, "a0"), gnet)
	cl := masterClient(t, m)
	ctx := context.Background()
	ip := hosts[0].IP.Addr().String()
	recordIP := func(id, want string) func() error {
		return func() error {
			info, err := cl.Agent(ctx, id)
			if err != nil {
				return err
			}
			if info.IP != want {
				return fmt.Errorf("%s's record has ip %s, want %s", id, info.IP, want)
			}
			return nil
		}
	}
	testutil.Eventually(t, 0, "the agent registered with its IP", recordIP(a.id, ip))
	if _, err := cl.Register(ctx, api.RegisterRequest{AgentID: "thief", IP: ip}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the agent took its IP back", recordIP(a.id, ip))
	testutil.Eventually(t, 0, "the other registration lost it", recordIP("thief", api.NoIP))
	if got := counterValue(t, a.metrics.lostIP); got != 1 {
		t.Errorf("carve_agent_lost_ip_registrations_total = %v, want 1", got)
	}
}
