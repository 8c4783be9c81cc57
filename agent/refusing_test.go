package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// peerRoutes reads host's kernel back: the destinations routed through a
// peer's VTEP address (the overlay's peer routes).
func peerRoutes(t *testing.T, host *netnslab.Host) []string {
	t.Helper()
	h, err := host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName("vtep1024")
	if err != nil {
		return nil
	}
	routes, err := h.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range routes {
		if r.Dst != nil && r.Gw != nil {
			out = append(out, r.Dst.String())
		}
	}
	slices.Sort(out)
	return out
}

// refusingGauge reads carve_agent_refusing_masters.
func refusingGauge(t *testing.T, a *Agent) float64 {
	t.Helper()
	return gaugeValue(t, a.metrics.refusing)
}

// masterSeesRefusing tells whether the master's status names the agent
// among those refusing its records.
func masterSeesRefusing(m *master.Master, id string) bool {
	tr := m.ClusterStatus().AgentTrust
	return tr != nil && slices.ContainsFunc(tr.Refusing, func(r api.AgentRefusing) bool { return r.AgentID == id })
}

// TestRefusingAgentKeepsItsKernel (issue 27, item 4): an agent restarted
// with a signing key that verifies neither its saved records nor the
// masters' state keeps the peer routes it had, reports the refusal (the
// gauge, its report to the masters) and takes the
// masters' state again, programming from it, once restarted with the key
// that verifies it. Before the fix the restarted agent reconciled the
// membership it could verify, none, and removed every peer route.
func TestRefusingAgentKeepsItsKernel(t *testing.T) {
	hosts, dir, _ := hostsWithMaster(t, 2)
	k1pub, k1 := testKey(t)
	k2pub, _ := testKey(t)
	m := mastertest.StartSigning(t, filepath.Join(dir, "signing"), state.DefaultConfig(), quietLogger(), k1)
	url := "http://" + m.HTTPAddr()
	gnet := fakegossip.New(fakegossip.Config{Seed: 27})
	t.Cleanup(gnet.Close)
	withKey := func(k []byte) func(*Config) { return func(c *Config) { c.SigningKey = k } }
	adir := filepath.Join(dir, "a0")
	a := runAgent(t, newTestAgent(t, hosts[0], url, adir, gnet, withKey(k1pub)))
	b := startAgent(t, hosts[1], url, filepath.Join(dir, "a1"), gnet)
	var routes []string
	testutil.Eventually(t, 0, "the agents program each other", func() error {
		if !programmedPeers(a.Agent)[b.ID()] || !programmedPeers(b.Agent)[a.ID()] {
			return fmt.Errorf("a programmed %v, b %v", programmedPeers(a.Agent), programmedPeers(b.Agent))
		}
		if routes = peerRoutes(t, hosts[0]); len(routes) == 0 {
			return fmt.Errorf("no peer route in host 0's kernel yet")
		}
		return nil
	})

	// Restarted with a key that verifies nothing it has or is given.
	a.stop(t)
	a = runAgent(t, newTestAgent(t, hosts[0], url, adir, gnet, withKey(k2pub)))
	testutil.Eventually(t, 0, "the agent refuses the masters and says so", func() error {
		if refusingGauge(t, a.Agent) != 1 || statesRefused(t, a.Agent, stateRefusedKey) < 2 {
			return fmt.Errorf("refusing gauge %v, states refused %v", refusingGauge(t, a.Agent), statesRefused(t, a.Agent, stateRefusedKey))
		}
		if !masterSeesRefusing(m, a.ID()) {
			return fmt.Errorf("the master's status does not name %s refusing: %+v", a.ID(), m.ClusterStatus().AgentTrust)
		}
		return nil
	})
	if got := peerRoutes(t, hosts[0]); !slices.Equal(got, routes) {
		t.Errorf("while refusing the masters the agent's kernel routes %v, want what it had: %v", got, routes)
	}
	for _, r := range m.ClusterStatus().AgentTrust.Refusing {
		if r.AgentID == a.ID() && !strings.Contains(r.Reason, "do not verify") && !strings.Contains(r.Reason, "signing key") {
			t.Errorf("the report to the masters says refusing %q", r.Reason)
		}
	}
	// Its overlays are not shown OK (ipam show and the DC/OS endpoint
	// read these): no change of the masters reaches them.
	const refusedStatus = "refusing the masters' records"
	for _, ov := range a.Overlay().Overlays {
		if ov.State.Status != api.StatusFailed || !strings.Contains(ov.State.Error, refusedStatus) {
			t.Errorf("overlay %s of the refusing agent: %+v, want %s saying %q", ov.Info.Name, ov.State, api.StatusFailed, refusedStatus)
		}
	}
	testutil.Eventually(t, 0, "the masters' record shows the refusing agent's overlays failed", func() error {
		info, err := masterClient(t, m).Agent(context.Background(), a.ID())
		if err != nil {
			return err
		}
		for _, ov := range info.Overlays {
			if ov.State.Status != api.StatusFailed || !strings.Contains(ov.State.Error, refusedStatus) {
				return fmt.Errorf("overlay %s: %+v", ov.Info.Name, ov.State)
			}
		}
		return nil
	})

	// Given the key that verifies the masters' state: its saved records
	// are there (a refusing agent saves nothing: it would drop what it
	// refused, and empty its kernel at the next start), and it is
	// programmed from the masters' state.
	a.stop(t)
	restarted := newTestAgent(t, hosts[0], url, adir, gnet, withKey(k1pub))
	if _, ok := restarted.members.Record(b.ID()); !ok {
		t.Errorf("restarted with the right key, the agent loaded no record of %s: the refusing agent saved its membership without it", b.ID())
	}
	a = runAgent(t, restarted)
	testutil.Eventually(t, 0, "the agent takes the masters' state again", func() error {
		if refusingGauge(t, a.Agent) != 0 || !programmedPeers(a.Agent)[b.ID()] || masterSeesRefusing(m, a.ID()) {
			return fmt.Errorf("refusing gauge %v, programmed %v, master's view %+v", refusingGauge(t, a.Agent), programmedPeers(a.Agent), m.ClusterStatus().AgentTrust)
		}
		return nil
	})
	if got := peerRoutes(t, hosts[0]); !slices.Equal(got, routes) {
		t.Errorf("the agent's kernel routes %v, want %v", got, routes)
	}
}

// TestWithUnverified: the refused saved records are programmed only for
// agents the membership holds nothing of: a record or a tombstone it holds
// (verified) wins.
func TestWithUnverified(t *testing.T) {
	members := membership.State{Records: []membership.PeerRecord{rec("a", 5, "198.18.0.1")}, Tombstones: []api.Tombstone{{AgentID: "gone", Version: 9}}}
	unverified := membership.State{Records: []membership.PeerRecord{rec("a", 3, "198.18.0.9"), rec("gone", 2, "198.18.0.2"), rec("b", 4, "198.18.0.3")}}
	tests := []struct {
		name       string
		unverified membership.State
		want       []string
	}{
		{"none", membership.State{}, []string{"a/5"}},
		{"kept for agents not held", unverified, []string{"a/5", "b/4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, r := range withUnverified(members, tt.unverified).Records {
				got = append(got, fmt.Sprintf("%s/%d", r.ID, r.Version))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("programmed %v, want %v", got, tt.want)
			}
		})
	}
}
