package agent

// A masters' table restored from a snapshot (issue 20, finding 1): the
// agents follow the restored table although its index is below what they
// saw, and refuse a master that missed the restore although its index is
// above.

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestAgentsFollowAWholeClusterRestore: a snapshot is saved, the cluster
// churns (an agent registers that the snapshot lacks), then the masters
// are restored onto empty data directories from the snapshot
// (--restore-from). The agents, without a restart, take the restored
// table (its index is lower than theirs), drop the agent of the churn, keep
// their peer programmed and the masters reachable. The old master, whose
// index is higher but who missed the restore, is then ignored; the restored
// one is followed again.
func TestAgentsFollowAWholeClusterRestore(t *testing.T) {
	t.Parallel() // its own lab, masters, proxies and gossip network; mostly waits on the agents' retries
	hosts, dir, m := hostsWithMaster(t, 2)
	ctx := context.Background()
	_, proxies, agents := agentsBehindProxies(t, hosts, m, dir, 20)
	old := masterClient(t, m)
	snapshot, err := old.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c1 := masterState(t, m).ClusterID

	// The churn after the snapshot.
	if _, err := old.Register(ctx, api.RegisterRequest{AgentID: "churn", IP: "198.18.3.1", MeshAddr: "198.18.3.1:6783"}); err != nil {
		t.Fatal(err)
	}
	for i, a := range agents {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d programs the agent of the churn", i), testutil.True(func() bool { return programmedPeers(a.Agent)["churn"] }))
	}
	seen := agents[0].Peers().MasterIndex

	// The whole-cluster restore: the master's data directory is lost; a
	// new master restores the snapshot before anything else.
	m.Close()
	restored := mastertest.Start(t, filepath.Join(dir, "m1-restored"), state.DefaultConfig(), quietLogger(), func(o *master.Options) { o.RestoreFrom = snapshot })
	rst := masterState(t, restored)
	if rst.Restore == nil || rst.ClusterID != c1 || rst.Index >= seen {
		t.Fatalf("restored master: restore %+v, cluster id %q (want %s), index %d (want below the agents' %d)", rst.Restore, rst.ClusterID, c1, rst.Index, seen)
	}
	for _, p := range proxies {
		p.switchTo(restored)
	}
	follows := func(i int, a *runningAgent, m *master.Master) func() error {
		return func() error {
			idx := masterState(t, m).Index
			p := a.Peers()
			if p.MasterIndex != idx || !p.MastersReachable {
				return fmt.Errorf("master index %d (the master's %d), masters reachable %v", p.MasterIndex, idx, p.MastersReachable)
			}
			if peers := programmedPeers(a.Agent); len(peers) != 1 || peers["churn"] {
				return fmt.Errorf("programmed peers %v, want only the other agent", peers)
			}
			if p.ClusterID != c1 {
				return fmt.Errorf("cluster id %q, want %s", p.ClusterID, c1)
			}
			return nil
		}
	}
	for i, a := range agents {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d follows the restored master", i), follows(i, a, restored))
		if n := counterValue(t, a.metrics.restores); n != 1 {
			t.Errorf("agent %d counted %v restores, want 1", i, n)
		}
	}
	for i, a := range agents {
		o := agents[1-i].Overlay()
		vx := o.Overlays[0].Backend.VXLAN
		if !kernelHasPeer(t, hosts[i], stripPrefix(vx.VTEPIP), vx.VTEPMAC, o.IP, o.Overlays[0].Subnet) {
			t.Errorf("host %d's kernel lost the other agent", i+1)
		}
		_ = a
	}

	// The old master comes back: higher index, no restore. Ignored.
	restored.Close()
	after := max(agents[0].Peers().MasterIndex, agents[1].Peers().MasterIndex)
	stale := startMaster(t, filepath.Join(dir, "m1"))
	si := masterState(t, stale).Index
	if si <= after {
		t.Fatalf("the stale master's index %d is not above the agents' %d", si, after)
	}
	staleBefore := []float64{counterValue(t, agents[0].metrics.staleStates), counterValue(t, agents[1].metrics.staleStates)}
	for _, p := range proxies {
		p.switchTo(stale)
	}
	for i, a := range agents {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d ignores the master that missed the restore", i), testutil.True(func() bool {
			return counterValue(t, a.metrics.staleStates) > staleBefore[i]
		}))
		// The restored master's index may have moved past after (the
		// agents' reports) before it closed: what the agent must not have
		// is the stale master's index, or its churn.
		if p := a.Peers(); p.MasterIndex >= si || programmedPeers(a.Agent)["churn"] {
			t.Errorf("agent %d took the state of the master that missed the restore: index %d (the stale master's %d), peers %v", i, p.MasterIndex, si, programmedPeers(a.Agent))
		}
	}

	// The restored master again: followed.
	stale.Close()
	restored = startMaster(t, filepath.Join(dir, "m1-restored"))
	for _, p := range proxies {
		p.switchTo(restored)
	}
	for i, a := range agents {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d follows the restored master again", i), follows(i, a, restored))
	}
}
