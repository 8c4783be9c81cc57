package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// TestSnapshotRestore runs the procedures of docs/operations.md, section
// 9a (issue 20, finding 1), with containers pinging throughout:
//
//  1. carve snapshot save, then churn (an agent registers that the
//     snapshot lacks), then carve snapshot restore on the running cluster:
//     the agents drop the agent of the churn, and nothing else moves.
//  2. churn again, then every master stopped, its data directory moved
//     away, and started on an empty one with --restore-from: the agents,
//     not restarted, follow the restored cluster (the same cluster id, a
//     lower index than they saw), masters reachable, their kernels as the
//     masters' state says; then the masters restarted as usual.
func TestSnapshotRestore(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	ctx := within(t, 6*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	containers := containerPerHost(ctx, t, c)
	waitKernelMatchesMasters(ctx, t, c)
	pingAll(ctx, t, containers)
	saved, err := c.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	operator := func(args ...string) string {
		t.Helper()
		args = append(append(args, "--masters", strings.Join(c.MasterURLs(), ",")), c.OperatorArgs()...)
		out, err := c.RunCarve(ctx, c.Host(1), args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("carve %s: %s", args[0]+" "+args[1], out)
		return string(out)
	}
	file := filepath.Join(t.TempDir(), "carve.json")
	out := operator("snapshot", "save", file)
	_, tail, _ := strings.Cut(out, "state index ")
	from, err := strconv.ParseUint(strings.TrimRight(strings.Fields(tail + " -")[0], ","), 10, 64)
	if err != nil {
		t.Fatalf("carve snapshot save printed no state index: %q", out)
	}
	churn := func(id, ip string) {
		t.Helper()
		register(ctx, t, c, api.RegisterRequest{AgentID: id, IP: ip, MeshAddr: ip + ":6783"})
		waitAgentsSee(ctx, t, c, func(p *api.AgentPeers) error {
			if !hasPeer(p, id) {
				return fmt.Errorf("does not know %s yet", id)
			}
			return nil
		})
	}

	// 1. Online.
	churn("churn-1", "198.18.9.1")
	operator("snapshot", "restore", file)
	restored := waitRestored(ctx, t, c, saved.ClusterID, from, "churn-1")
	pingAll(ctx, t, containers)

	// 2. Every master's data lost.
	churn("churn-2", "198.18.9.2")
	for _, m := range c.Masters() {
		if err := c.StopMaster(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	pingAll(ctx, t, containers)
	for _, m := range c.Masters() {
		m.DataDir += ".new" // the old one stays, as the procedure keeps it
		if err := c.StartMasterWith(m, "--restore-from", file); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	again := waitRestored(ctx, t, c, saved.ClusterID, from, "churn-2")
	if again.Restore.Epoch <= restored.Restore.Epoch {
		t.Errorf("the whole-cluster restore's epoch %d is not above the online one's %d", again.Restore.Epoch, restored.Restore.Epoch)
	}
	pingAll(ctx, t, containers)
	// The units' start, without the flag.
	for _, m := range c.Masters() {
		if err := c.StopMaster(ctx, m); err != nil {
			t.Fatal(err)
		}
		if err := c.StartMaster(m); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitLeader(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	waitKernelMatchesMasters(ctx, t, c)
	pingAll(ctx, t, containers)
}

// waitRestored waits until the masters show a restore of the snapshot of
// cluster clusterID at state index from, without the agent gone, and every agent follows them:
// masters reachable, their index, no peer gone, every other host
// programmed, the kernel as the state says. It returns the state.
func waitRestored(ctx context.Context, t *testing.T, c *labcluster.Cluster, clusterID string, from uint64, gone string) *api.State {
	t.Helper()
	var st *api.State
	err := retry.Until(ctx, 200*time.Millisecond, func() error {
		var err error
		if st, err = c.State(ctx); err != nil {
			return err
		}
		if st.Restore == nil || st.Restore.From != from {
			return fmt.Errorf("the masters show restore %+v, want one from index %d", st.Restore, from)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.ClusterID != clusterID {
		t.Errorf("restored into cluster %q, the snapshot's is %q", st.ClusterID, clusterID)
	}
	if slices.ContainsFunc(st.Agents, func(a api.AgentInfo) bool { return a.AgentID == gone }) {
		t.Errorf("the restored state holds %s, which the snapshot lacks", gone)
	}
	waitAgentsSee(ctx, t, c, func(p *api.AgentPeers) error {
		cur, err := c.State(ctx)
		if err != nil {
			return err
		}
		switch {
		case !p.MastersReachable:
			return fmt.Errorf("masters not reachable (master index %d, the masters' %d)", p.MasterIndex, cur.Index)
		case p.MasterIndex < st.Index:
			return fmt.Errorf("master index %d, the restore is at %d", p.MasterIndex, st.Index)
		case hasPeer(p, gone):
			return fmt.Errorf("still knows %s", gone)
		case p.ClusterID != clusterID:
			return fmt.Errorf("cluster %q, want %s", p.ClusterID, clusterID)
		}
		return nil
	})
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	waitKernelMatchesMasters(ctx, t, c)
	return st
}

// waitAgentsSee waits until check passes on every agent's peers.
func waitAgentsSee(ctx context.Context, t *testing.T, c *labcluster.Cluster, check func(*api.AgentPeers) error) {
	t.Helper()
	for _, h := range c.Hosts() {
		err := retry.Until(ctx, 100*time.Millisecond, func() error {
			p, err := c.AgentClient(h).Peers(ctx)
			if err != nil {
				return err
			}
			return check(p)
		})
		if err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
}

// hasPeer tells whether an agent's peers list id.
func hasPeer(p *api.AgentPeers, id string) bool {
	return slices.ContainsFunc(p.Peers, func(peer api.AgentPeer) bool { return peer.AgentID == id })
}
