package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// TestSnapshotRestore runs the procedures of docs/operations.md, section
// 9a (issue 20, finding 1), with containers pinging throughout:
//
//  1. carve snapshot save, then a host joins (its agent and a container)
//     and churn (an agent registers that the snapshot lacks), then carve
//     snapshot restore on the running cluster while the joined host's
//     agent is stopped: the agents drop the agent of the churn, nothing
//     else moves, a new agent is not leased the joined host's space (the
//     restore deleted its agent and quarantined its space), and the
//     joined host's agent, started again, registers again with its own
//     subnet: its container keeps its address and pings everywhere.
//  2. churn again, then every master stopped, its data directory moved
//     away, and started on an empty one with --restore-from: the agents,
//     not restarted, follow the restored cluster (the same cluster id, a
//     lower index than they saw), masters reachable, their kernels as the
//     masters' state says; then the masters restarted as usual.
func TestSnapshotRestore(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	ctx := within(t, 7*converge)
	if err := c.StartMasters(ctx); err != nil {
		t.Fatal(err)
	}
	joined := c.Host(3) // joins after the snapshot
	var containers []*labcluster.Container
	for _, h := range others(c, joined) {
		if err := c.StartAgent(h); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, h := range others(c, joined) {
		ct, err := c.AddCNIContainer(ctx, h, "carve", labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		containers = append(containers, ct)
	}
	waitKernelsMatch(ctx, t, c, others(c, joined)...)
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
	if err := c.StartAgent(joined); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	ct, err := c.AddCNIContainer(ctx, joined, "carve", labcluster.CNIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	containers = append(containers, ct)
	pingAll(ctx, t, containers)
	joinedSubnet := subnetOf(ctx, t, c, joined.AgentID())
	churn("churn-1", "198.18.9.1")
	if err := c.StopAgent(ctx, joined); err != nil {
		t.Fatal(err)
	}
	operator("snapshot", "restore", file)
	restored := waitRestored(ctx, t, c, saved.ClusterID, from, "churn-1")
	if slices.ContainsFunc(restored.Agents, func(a api.AgentInfo) bool { return a.AgentID == joined.AgentID() }) {
		t.Fatalf("the restored state holds the agent of %s, which joined after the snapshot", joined.Name)
	}
	newcomer := register(ctx, t, c, api.RegisterRequest{AgentID: "newcomer", IP: "198.18.9.3", MeshAddr: "198.18.9.3:6783"})
	if len(newcomer.Overlays) == 0 || newcomer.Overlays[0].Subnet == joinedSubnet {
		t.Fatalf("a new agent was leased %+v after the restore, where %s's agent (deleted by the restore) held %s: its space was freed, not quarantined",
			newcomer.Overlays, joined.Name, joinedSubnet)
	}
	if err := c.StartAgent(joined); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	if got := subnetOf(ctx, t, c, joined.AgentID()); got != joinedSubnet {
		t.Errorf("%s's agent registered again with %s, want its own %s back", joined.Name, got, joinedSubnet)
	}
	waitKernelMatchesMasters(ctx, t, c)
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
// cluster clusterID at state index from, without the agent gone, and every agent that runs follows them:
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
	waitKernelsMatch(ctx, t, c, slices.DeleteFunc(c.Hosts(), func(h *labcluster.Host) bool { return !h.Agent.Running() })...)
	return st
}

// subnetOf is the subnet of the first overlay the masters lease agent id
// (it waits until they list the agent).
func subnetOf(ctx context.Context, t *testing.T, c *labcluster.Cluster, id string) string {
	t.Helper()
	var subnet string
	err := retry.Until(ctx, 200*time.Millisecond, func() error {
		st, err := c.State(ctx)
		if err != nil {
			return err
		}
		for _, a := range st.Agents {
			if a.AgentID == id && len(a.Overlays) > 0 && a.Overlays[0].Subnet != "" {
				subnet = a.Overlays[0].Subnet
				return nil
			}
		}
		return fmt.Errorf("the masters lease agent %q no subnet yet", id)
	})
	if err != nil {
		t.Fatal(err)
	}
	return subnet
}

// waitAgentsSee waits until check passes on the peers of every agent that
// runs.
func waitAgentsSee(ctx context.Context, t *testing.T, c *labcluster.Cluster, check func(*api.AgentPeers) error) {
	t.Helper()
	for _, h := range c.Hosts() {
		if !h.Agent.Running() {
			continue
		}
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

// TestRestoreKeepsAGrownBlock: a snapshot saved, host 1 grows a block
// from the masters and a container gets an address there, the snapshot
// restored on the running cluster (carve snapshot restore). The restore
// keeps the block host 1's (docs/design.md, "A restore takes back from a
// live agent nothing"): host 1 isolates nothing, every kernel routes the
// block to host 1 as the masters' restored state says, the container
// pings the other host's, and an ADD on host 2 is not given an address
// there.
func TestRestoreKeepsAGrownBlock(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	netCfg := netconfig.Default()
	// Four /28s: one leased to each host, two left to grow into.
	netCfg.Overlays = []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/26", Prefix: 28}}
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 2, Masters: 1, Prefix: prefix, Network: &netCfg})
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h1, h2 := c.Host(1), c.Host(2)
	saved, err := c.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "carve.json")
	args := append([]string{"snapshot", "save", file, "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
	if out, err := c.RunCarve(ctx, h1, args...); err != nil {
		t.Fatalf("carve snapshot save: %v\n%s", err, out)
	}
	other, err := c.AddCNIContainer(ctx, h2, "carve", labcluster.CNIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var inGrown *labcluster.Container
	var grown netip.Prefix
	for i := 0; inGrown == nil; i++ {
		if i > 12 {
			t.Fatalf("%d containers on host 1 and none in a grown block", i)
		}
		ct, err := c.AddCNIContainer(ctx, h1, "carve", labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if b := blockOf(ipamStatus(ctx, t, c, h1, "carve"), ct.Addr.Addr()); b != nil && b.Origin == api.BlockGrown {
			inGrown, grown = ct, netip.MustParsePrefix(b.Prefix)
		}
	}
	hosts := []*labcluster.Host{h1, h2}
	vteps := map[*labcluster.Host]netip.Addr{h1: vtepOf(ctx, t, c, h1), h2: vtepOf(ctx, t, c, h2)}
	both := []*labcluster.Container{inGrown, other}
	routed := func(when string) {
		t.Helper()
		if err := retry.Until(ctx, 200*time.Millisecond, func() error { return routedToHonest(c, hosts, vteps, both) }); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		pingAll(ctx, t, both)
	}
	routed("before the restore")

	args = append([]string{"snapshot", "restore", file, "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
	if out, err := c.RunCarve(ctx, h1, args...); err != nil {
		t.Fatalf("carve snapshot restore: %v\n%s", err, out)
	}
	var st *api.State
	err = retry.Until(ctx, 200*time.Millisecond, func() error {
		if st, err = c.State(ctx); err == nil && (st.Restore == nil || st.Restore.From != saved.Index) {
			err = fmt.Errorf("the masters show restore %+v, want one from index %d", st.Restore, saved.Index)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitAgentsSee(ctx, t, c, func(p *api.AgentPeers) error {
		if p.MasterIndex < st.Index {
			return fmt.Errorf("master index %d, the restore is at %d", p.MasterIndex, st.Index)
		}
		return nil
	})
	var holder string
	for _, a := range st.Agents {
		for _, ov := range a.Overlays {
			for _, b := range ov.Blocks {
				if p, err := netip.ParsePrefix(b.Prefix); err == nil && p.Overlaps(grown) {
					holder = a.AgentID
				}
			}
		}
	}
	if holder != h1.AgentID() {
		t.Fatalf("after the restore the masters' records give %s to %q, want host 1's %s (it grew it after the snapshot)", grown, holder, h1.AgentID())
	}
	routed("after the restore")
	isolated, err := labcluster.MetricSample(ctx, c.HTTPClient(), h1.AgentURL(), `carve_agent_ipam_isolated_addresses{overlay="carve"}`)
	if err != nil || isolated != 0 {
		t.Errorf("host 1's carve_agent_ipam_isolated_addresses: %v, %v; want 0: the restore took nothing back", isolated, err)
	}
	if b := blockOf(ipamStatus(ctx, t, c, h1, "carve"), inGrown.Addr.Addr()); b == nil || b.Prefix != grown.String() {
		t.Errorf("after the restore host 1 hands out from %+v for %s, want its grown %s", b, inGrown.Addr, grown)
	}
	ct, err := c.AddCNIContainer(ctx, h2, "carve", labcluster.CNIOptions{})
	if err == nil && grown.Contains(ct.Addr.Addr()) {
		t.Errorf("after the restore host 2 was given %s, inside host 1's %s", ct.Addr, grown)
	}
}
