package agent

// Masters that went back: a stale master of the same cluster is ignored, a
// rebuilt cluster (a new cluster id) resets the agents' membership.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/agent/store"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// copyDir copies a stopped master's data dir.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

// TestStaleMasterIsIgnored: a master of the same cluster that is behind (a
// lower index: here a copy of the master's data dir taken early) is not a
// rebuilt cluster. The agents keep their peers, routes, network
// configuration and master index, persist nothing of it, and an agent
// restarted meanwhile comes back from its disk. The up-to-date master
// coming back is followed as usual.
func TestStaleMasterIsIgnored(t *testing.T) {
	t.Parallel() // its own lab, masters, proxies and gossip network; mostly waits on the agents' retries
	hosts, dir, m := hostsWithMaster(t, 2)
	mdir, staleDir := filepath.Join(dir, "m1"), filepath.Join(dir, "m1-stale")
	m.Close()
	copyDir(t, mdir, staleDir)
	m = startMaster(t, mdir)

	gnet, proxies, agents := agentsBehindProxies(t, hosts, m, dir, 12)
	infos := []*api.AgentInfo{agents[0].Overlay(), agents[1].Overlay()}
	// Quiet first: once both agents have reported their configuration on
	// their records (a report is a commit), nothing else moves the index.
	testutil.Eventually(t, 0, "both agents reported, and their master index reaches the master's", testutil.True(func() bool {
		st := masterState(t, m)
		for _, a := range st.Agents {
			if len(a.Overlays) == 0 || a.Overlays[0].State.Status != api.StatusOK {
				return false
			}
		}
		return len(st.Agents) == 2 && agents[0].Peers().MasterIndex == st.Index && agents[1].Peers().MasterIndex == st.Index
	}))
	before := agents[0].Peers().MasterIndex
	network := *agents[0].network
	c1 := masterState(t, m).ClusterID
	if c1 == "" {
		t.Fatal("the master serves no cluster id")
	}

	m.Close()
	stale := startMaster(t, staleDir)
	if si := masterState(t, stale).Index; si >= before {
		t.Fatalf("the stale master's index %d is not below the agents' %d", si, before)
	}
	for _, p := range proxies {
		p.switchTo(stale)
	}
	// Each agent has read the stale master's state (twice: it went on
	// watching after the first).
	for i, p := range proxies {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d reads the stale master", i), testutil.True(func() bool { return p.statesServed() >= 2 }))
	}
	checkKept := func(i int, a *Agent) {
		t.Helper()
		peers := a.Peers()
		if len(peers.Peers) != 1 || !peers.Peers[0].Programmed {
			t.Errorf("agent %d after the stale master: peers %+v", i, peers.Peers)
		}
		if peers.MasterIndex != before {
			t.Errorf("agent %d took the stale master's index: %d, want %d", i, peers.MasterIndex, before)
		}
		a.mu.RLock()
		if a.network == nil || !jsonEqual(*a.network, network) {
			t.Errorf("agent %d network config changed to %+v", i, a.network)
		}
		a.mu.RUnlock()
		if ov := a.Overlay().Overlay("carve"); ov == nil || ov.State.Status != api.StatusOK {
			t.Errorf("agent %d overlay after the stale master: %+v", i, ov)
		}
		o := infos[1-i]
		vx := o.Overlays[0].Backend.VXLAN
		if !kernelHasPeer(t, hosts[i], stripPrefix(vx.VTEPIP), vx.VTEPMAC, o.IP, o.Overlays[0].Subnet) {
			t.Errorf("host %d's kernel lost the other agent", i+1)
		}
	}
	for i, a := range agents {
		checkKept(i, a.Agent)
		if n := counterValue(t, a.metrics.staleStates); n < 1 {
			t.Errorf("agent %d counted %v stale master states", i, n)
		}
	}

	// Host 2 reboots while only the stale master answers: its disk holds
	// the last good state, and it programs its routes from there.
	agents[1].stop(t)
	s, err := store.Open(filepath.Join(dir, "a1"))
	if err != nil {
		t.Fatal(err)
	}
	persisted, err := s.Load()
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	if persisted.MasterIndex != before || persisted.ClusterID != c1 || len(persisted.Membership.Records) != 2 {
		t.Fatalf("persisted: index %d cluster %q %d records; want %d, %s, 2", persisted.MasterIndex, persisted.ClusterID, len(persisted.Membership.Records), before, c1)
	}
	deleteLink(t, hosts[1], "vtep1024")
	agents[1] = startAgent(t, hosts[1], proxies[1].URL(), filepath.Join(dir, "a1"), gnet)
	testutil.Eventually(t, 0, "the rebooted agent programs its peer from disk", testutil.True(func() bool { return len(programmedPeers(agents[1].Agent)) == 1 }))
	proxies[1].switchTo(stale)
	testutil.Eventually(t, 0, "the rebooted agent reads the stale master", testutil.True(func() bool { return proxies[1].statesServed() >= 2 }))
	checkKept(1, agents[1].Agent)

	// The up-to-date master is back: the agents follow it, in the same cluster.
	stale.Close()
	m = startMaster(t, mdir)
	for _, p := range proxies {
		p.switchTo(m)
	}
	for i, a := range agents {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d follows the master again", i), func() error {
			idx := masterState(t, m).Index
			if p := a.Peers(); p.MasterIndex != idx || !p.MastersReachable || len(programmedPeers(a.Agent)) != 1 {
				return fmt.Errorf("master index %d (master at %d), reachable %v, peers %+v", p.MasterIndex, idx, p.MastersReachable, p.Peers)
			}
			return nil
		})
		if id := a.Peers().ClusterID; id != c1 {
			t.Errorf("agent %d cluster id %q, want %s", i, id, c1)
		}
	}
}

// agentsBehindProxies starts an agent per host on a fake gossip network
// (seed), each watching m through its own proxy (that the test switches to
// another master), and waits until each programs the others.
func agentsBehindProxies(t *testing.T, hosts []*netnslab.Host, m *master.Master, dir string, seed uint64) (*fakegossip.Network, []*masterProxy, []*runningAgent) {
	t.Helper()
	gnet := fakegossip.New(fakegossip.Config{Seed: seed, GossipInterval: 300 * time.Millisecond})
	t.Cleanup(gnet.Close)
	t.Logf("fake gossip seed %d", gnet.Seed())
	proxies := make([]*masterProxy, len(hosts))
	agents := make([]*runningAgent, len(hosts))
	for i, h := range hosts {
		proxies[i] = newMasterProxy(t, m)
		agents[i] = startAgent(t, h, proxies[i].URL(), filepath.Join(dir, fmt.Sprintf("a%d", i)), gnet)
	}
	for i, a := range agents {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d programs the others", i), testutil.True(func() bool { return len(programmedPeers(a.Agent)) == len(hosts)-1 }))
	}
	return gnet, proxies, agents
}

// deleteLink deletes a link in host's namespace (and with it every route
// and neighbour on it).
func deleteLink(t *testing.T, host *netnslab.Host, name string) {
	t.Helper()
	h, err := host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDel(l); err != nil {
		t.Fatal(err)
	}
}

// TestRebuiltClusterResetsMembership: the masters are rebuilt from nothing
// (a new cluster id) and their index has already gone past the old
// cluster's. The agents drop the old cluster's records and tombstones,
// register with the new masters, tell the IPAM, persist the new cluster id,
// and refuse gossip that still carries the old cluster's records.
func TestRebuiltClusterResetsMembership(t *testing.T) {
	hosts, dir, m1 := hostsWithMaster(t, 2)
	old := masterClient(t, m1)
	ctx := context.Background()
	// The old cluster also knows an agent that will not be in the new one,
	// and a deleted one.
	if _, err := old.Register(ctx, api.RegisterRequest{AgentID: "old-only", IP: "198.18.3.1", MeshAddr: "198.18.3.1:6783"}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Register(ctx, api.RegisterRequest{AgentID: "gone", IP: "198.18.3.2"}); err != nil {
		t.Fatal(err)
	}
	if err := old.DeleteAgent(ctx, "gone"); err != nil {
		t.Fatal(err)
	}

	gnet := fakegossip.New(fakegossip.Config{Seed: 13, GossipInterval: 300 * time.Millisecond, DropRate: 0.1})
	t.Cleanup(gnet.Close)
	t.Logf("fake gossip seed %d", gnet.Seed())
	proxies := []*masterProxy{newMasterProxy(t, m1), newMasterProxy(t, m1)}
	agents := make([]*runningAgent, 2)
	var mu sync.Mutex
	rebuilt := map[string][]string{}
	for i, h := range hosts {
		a := newTestAgent(t, h, proxies[i].URL(), filepath.Join(dir, fmt.Sprintf("a%d", i)), gnet)
		a.onRebuild = func(clusterID string) {
			mu.Lock()
			defer mu.Unlock()
			rebuilt[a.ID()] = append(rebuilt[a.ID()], clusterID)
		}
		agents[i] = runAgent(t, a)
	}
	for i, a := range agents {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d knows the old cluster", i), func() error {
			p := a.Peers()
			if !programmedPeers(a.Agent)["old-only"] || len(programmedPeers(a.Agent)) != 2 {
				return fmt.Errorf("peers %+v", p.Peers)
			}
			if !slices.ContainsFunc(p.Tombstones, func(tb api.Tombstone) bool { return tb.AgentID == "gone" }) {
				return fmt.Errorf("no tombstone of gone: %+v", p.Tombstones)
			}
			return nil
		})
	}
	oldIndex, c1 := masterState(t, m1).Index, masterState(t, m1).ClusterID

	// The rebuild: a master from nothing whose index has already passed the
	// old one's (agents that registered meanwhile, then left).
	m1.Close()
	m2 := startMaster(t, filepath.Join(dir, "m2"))
	fresh := masterClient(t, m2)
	var fillers []string
	for i := 0; masterState(t, m2).Index <= oldIndex+2; i++ {
		id := fmt.Sprintf("filler-%d", i)
		if _, err := fresh.Register(ctx, api.RegisterRequest{AgentID: id, IP: fmt.Sprintf("198.18.4.%d", i+1)}); err != nil {
			t.Fatal(err)
		}
		fillers = append(fillers, id)
	}
	if _, err := fresh.DeleteAgents(ctx, fillers); err != nil {
		t.Fatal(err)
	}
	c2 := masterState(t, m2).ClusterID
	if c1 == "" || c2 == "" || c1 == c2 {
		t.Fatalf("cluster ids %q (old) and %q (rebuilt): want two different ids", c1, c2)
	}
	for _, p := range proxies {
		p.switchTo(m2)
	}
	for i, a := range agents {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d moves to the new cluster", i), func() error {
			if _, err := fresh.Agent(ctx, a.ID()); err != nil {
				return fmt.Errorf("not registered with the new masters: %w", err)
			}
			p := a.Peers()
			for _, peer := range p.Peers {
				if peer.AgentID == "old-only" {
					return fmt.Errorf("still has the old cluster's record of old-only")
				}
			}
			if slices.ContainsFunc(p.Tombstones, func(tb api.Tombstone) bool { return tb.AgentID == "gone" }) {
				return fmt.Errorf("still has the old cluster's tombstone of gone")
			}
			if len(programmedPeers(a.Agent)) != 1 {
				return fmt.Errorf("peers %+v", p.Peers)
			}
			if p.ClusterID != c2 {
				return fmt.Errorf("cluster id %q, want %s", p.ClusterID, c2)
			}
			return nil
		})
	}
	mu.Lock()
	for _, a := range agents {
		if got := rebuilt[a.ID()]; !slices.Equal(got, []string{c2}) {
			t.Errorf("agent %s told its IPAM of rebuilds %v, want [%s]", a.ID(), got, c2)
		}
	}
	mu.Unlock()

	// A peer that still gossips the old cluster's records is refused.
	ghost, err := gnet.Join("ghost")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := json.Marshal(map[string]any{"cluster_id": c1, "records": []membership.PeerRecord{rec("old-only", 1<<40, "198.18.3.1")}})
	if err != nil {
		t.Fatal(err)
	}
	refusedBefore := []float64{refusedCount(t, agents[0].Agent, membership.RefusedOtherCluster), refusedCount(t, agents[1].Agent, membership.RefusedOtherCluster)}
	if _, err := ghost.Channel(GossipChannel, parrot{msg}); err != nil {
		t.Fatal(err)
	}
	for i, a := range agents {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d refuses the old cluster's gossip", i), testutil.True(func() bool {
			return refusedCount(t, a.Agent, membership.RefusedOtherCluster) > refusedBefore[i]
		}))
		if _, ok := a.members.Record("old-only"); ok {
			t.Errorf("agent %d merged a record of the old cluster", i)
		}
	}

	// The new cluster id is on disk.
	agents[0].stop(t)
	s, err := store.Open(filepath.Join(dir, "a0"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if p.ClusterID != c2 {
		t.Errorf("persisted cluster id %q, want %s", p.ClusterID, c2)
	}
}

func TestJudgeState(t *testing.T) {
	tests := []struct {
		name      string
		clusterID string
		epoch     uint64
		index     uint64
		st        api.State
		want      stateVerdict
	}{
		{"first state ever", "", 0, 0, api.State{Index: 5, ClusterID: "c1"}, stateCurrent},
		{"same cluster, further", "c1", 0, 5, api.State{Index: 9, ClusterID: "c1"}, stateCurrent},
		{"same cluster, same index", "c1", 0, 5, api.State{Index: 5, ClusterID: "c1"}, stateCurrent},
		{"same cluster, behind", "c1", 0, 5, api.State{Index: 3, ClusterID: "c1"}, stateStale},
		{"master without cluster id, behind", "c1", 0, 5, api.State{Index: 0}, stateStale},
		{"master without cluster id, further", "c1", 0, 5, api.State{Index: 6}, stateCurrent},
		{"agent without cluster id, behind", "", 0, 5, api.State{Index: 3, ClusterID: "c2"}, stateStale},
		{"agent without cluster id, further", "", 0, 5, api.State{Index: 7, ClusterID: "c2"}, stateCurrent},
		{"other cluster, behind", "c1", 0, 5, api.State{Index: 2, ClusterID: "c2"}, stateRebuilt},
		{"other cluster, further", "c1", 0, 5, api.State{Index: 50, ClusterID: "c2"}, stateRebuilt},
		{"restored, index lower", "c1", 0, 500, api.State{Index: 7, ClusterID: "c1", Restore: &api.Restore{Epoch: 10}}, stateRestored},
		{"restored, index higher", "c1", 0, 5, api.State{Index: 70, ClusterID: "c1", Restore: &api.Restore{Epoch: 10}}, stateRestored},
		{"restored again", "c1", 10, 70, api.State{Index: 8, ClusterID: "c1", Restore: &api.Restore{Epoch: 11}}, stateRestored},
		{"same restore, further", "c1", 10, 7, api.State{Index: 9, ClusterID: "c1", Restore: &api.Restore{Epoch: 10}}, stateCurrent},
		{"same restore, behind", "c1", 10, 9, api.State{Index: 8, ClusterID: "c1", Restore: &api.Restore{Epoch: 10}}, stateStale},
		{"master that missed the restore, index higher", "c1", 10, 7, api.State{Index: 900, ClusterID: "c1"}, stateStale},
		{"master of an older restore, index higher", "c1", 10, 7, api.State{Index: 900, ClusterID: "c1", Restore: &api.Restore{Epoch: 9}}, stateStale},
		{"other cluster after a restore", "c1", 10, 7, api.State{Index: 3, ClusterID: "c2"}, stateRebuilt},
		{"first state ever, restored", "", 0, 0, api.State{Index: 5, ClusterID: "c1", Restore: &api.Restore{Epoch: 10}}, stateCurrent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := judgeState(tt.clusterID, tt.epoch, tt.index, &tt.st); got != tt.want {
				t.Errorf("judgeState(%q, %d, %d, index %d cluster %q epoch %d) = %v, want %v", tt.clusterID, tt.epoch, tt.index, tt.st.Index, tt.st.ClusterID, tt.st.Restore.RestoreEpoch(), got, tt.want)
			}
		})
	}
}
