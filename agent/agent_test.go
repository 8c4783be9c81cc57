package agent

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	cni "github.com/carve-net/carve/cni/netconf"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/membershiptest"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// rec is membershiptest.Agent's record, as gossip carries it.
func rec(id string, v uint64, ip string) membership.PeerRecord {
	return membership.NewPeerRecord(membershiptest.Agent(id, v, ip))
}

// testKey is an ed25519 key pair for signing records in tests.
func testKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	return membershiptest.Key(t)
}

// signedPeer is membershiptest.SignedAgent's record, as gossip carries it.
func signedPeer(key ed25519.PrivateKey, cluster string, mutate ...func(*api.AgentInfo)) membership.PeerRecord {
	return membership.NewPeerRecord(membershiptest.SignedAgent(key, cluster, mutate...))
}

func signedTombstone(key ed25519.PrivateKey, cluster, id string, v uint64) api.Tombstone {
	return membershiptest.SignedTombstone(key, cluster, id, v)
}

func quietLogger() *slog.Logger {
	if os.Getenv("CARVE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// hostsWithMaster skips the test without root; it returns n host
// namespaces, a directory for the test, and a master running in dir/m1.
func hostsWithMaster(t *testing.T, n int) ([]*netnslab.Host, string, *master.Master) {
	t.Helper()
	testutil.Require(t, netnslab.IsRoot(), "needs root to create network namespaces")
	lab := netnslab.ForTest(t, netnslab.Options{Hosts: n})
	dir := t.TempDir()
	return lab.Hosts(), dir, startMaster(t, filepath.Join(dir, "m1"))
}

// startMaster runs a one-voter master on loopback (the agent tests are about
// agents; the 3-master cluster is tested in package master and in e2e).
func startMaster(t *testing.T, dir string) *master.Master {
	t.Helper()
	return mastertest.Start(t, dir, state.DefaultConfig(), quietLogger())
}

// runningAgent is an agent running in a goroutine.
type runningAgent struct {
	*Agent
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// stop ends the agent and waits for it (once; the cleanup calls it too).
func (r *runningAgent) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		if err := <-r.done; err != nil {
			t.Errorf("agent %s: %v", r.id, err)
		}
	})
}

func startAgent(t *testing.T, host *netnslab.Host, masterURL, dataDir string, gnet *fakegossip.Network) *runningAgent {
	t.Helper()
	return runAgent(t, newTestAgent(t, host, masterURL, dataDir, gnet))
}

// newTestAgent creates host's agent on a fake gossip network, not running
// yet (see runAgent). The masters of these tests serve plain http, and the
// fake gossip network has no password: the agent runs --insecure unless
// an option changes its configuration.
func newTestAgent(t *testing.T, host *netnslab.Host, masterURL, dataDir string, gnet *fakegossip.Network, opts ...func(*Config)) *Agent {
	t.Helper()
	cfg := Config{
		DataDir: dataDir, Masters: []string{masterURL}, ID: fmt.Sprintf("host-%d", host.Index), IP: host.IP.Addr(),
		HTTPAddr: "127.0.0.1:0", CNIConfDir: filepath.Join(dataDir, "cni"), Socket: filepath.Join(dataDir, "agent.sock"), MesosBridge: true, DockerBridge: true, ResyncInterval: time.Second,
		WatchWait: 2 * time.Second, NetNS: host.NsHandle(), Logger: quietLogger().With("host", host.Index),
		NewRouter: func(id string) (Router, error) {
			r, err := gnet.Join(id)
			if err != nil {
				return nil, err
			}
			return r, nil
		},
		Insecure: true,
	}
	for _, o := range opts {
		o(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// runAgent runs a until the test ends (or stop).
func runAgent(t *testing.T, a *Agent) *runningAgent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ra := &runningAgent{Agent: a, cancel: cancel, done: make(chan error, 1)}
	go func() { ra.done <- a.Run(ctx) }()
	t.Cleanup(func() { ra.stop(t) })
	return ra
}

// programmedPeers is the set of peers an agent reports programmed.
func programmedPeers(a *Agent) map[string]bool {
	out := map[string]bool{}
	for _, p := range a.Peers().Peers {
		if p.Programmed {
			out[p.AgentID] = true
		}
	}
	return out
}

// kernelHasPeer reads host's kernel back: neighbour, FDB entry and route of a peer.
func kernelHasPeer(t *testing.T, host *netnslab.Host, vtepIP, mac, underlay, subnet string) bool {
	t.Helper()
	h, err := host.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName("vtep1024")
	if err != nil {
		return false
	}
	neighs, err := h.NeighList(link.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	fdb, err := h.NeighList(link.Attrs().Index, 7 /* AF_BRIDGE */)
	if err != nil {
		t.Fatal(err)
	}
	routes, err := h.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var haveNeigh, haveFDB, haveRoute bool
	for _, n := range neighs {
		if n.IP.String() == vtepIP && n.HardwareAddr.String() == mac {
			haveNeigh = true
		}
	}
	for _, n := range fdb {
		if n.HardwareAddr.String() == mac && n.IP.String() == underlay {
			haveFDB = true
		}
	}
	for _, r := range routes {
		if r.Dst != nil && r.Dst.String() == subnet && r.Gw.String() == vtepIP {
			haveRoute = true
		}
	}
	return haveNeigh && haveFDB && haveRoute
}

// TestAgentsWithoutMasters: agents program each other from the masters'
// state; with the masters gone, a restarted agent works from its persisted
// state and learns what it missed through gossip.
func TestAgentsWithoutMasters(t *testing.T) {
	hosts, dir, m := hostsWithMaster(t, 3)
	url := "http://" + m.HTTPAddr()
	gnet := fakegossip.New(fakegossip.Config{Seed: 7, GossipInterval: 300 * time.Millisecond, DropRate: 0.1, DuplicateRate: 0.1})
	t.Cleanup(gnet.Close)
	t.Logf("fake gossip seed %d", gnet.Seed())

	agents := make([]*runningAgent, 3)
	for i, h := range hosts {
		agents[i] = startAgent(t, h, url, filepath.Join(dir, fmt.Sprintf("a%d", i)), gnet)
	}
	for i, a := range agents {
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d programs both others", i), testutil.True(func() bool { return len(programmedPeers(a.Agent)) == 2 }))
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d overlay OK", i), testutil.True(func() bool {
			ov := a.Overlay().Overlay("carve")
			return ov != nil && ov.State.Status == api.StatusOK
		}))
	}
	// Each agent wrote the CNI config of its overlay, naming its socket.
	conf, err := os.ReadFile(filepath.Join(dir, "a0", "cni", "carve.conflist"))
	if err != nil || !cni.IsCarveConflist(conf) || !strings.Contains(string(conf), filepath.Join(dir, "a0", "agent.sock")) {
		t.Fatalf("conflist: %v\n%s", err, conf)
	}
	// The kernel holds what the agents report.
	info2 := agents[1].Overlay()
	vx := info2.Overlays[0].Backend.VXLAN
	if !kernelHasPeer(t, hosts[0], "100.64.0.2", vx.VTEPMAC, hosts[1].IP.Addr().String(), info2.Overlays[0].Subnet) &&
		!kernelHasPeer(t, hosts[0], stripPrefix(vx.VTEPIP), vx.VTEPMAC, hosts[1].IP.Addr().String(), info2.Overlays[0].Subnet) {
		t.Fatalf("host 1's kernel lacks host 2's entries")
	}

	// Rings converge through gossip: allocations on agent 1 change its free
	// counts, and every agent ends up with the same ring bytes.
	for i := range 5 {
		if _, err := agents[0].IPAM().Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "rings converge", testutil.True(func() bool {
		gnet.GossipRound()
		first := agents[0].IPAM().Rings()
		for _, a := range agents[1:] {
			if !jsonEqual(a.IPAM().Rings(), first) {
				return false
			}
		}
		return len(first) == 1
	}))

	// Agent 3 stops; a new agent ("late", a record only) registers; agents 1
	// and 2 learn it from the masters; then every master goes away.
	agents[2].stop(t)
	client, err := apiclient.NewClient([]string{url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	late, err := client.Register(context.Background(), api.RegisterRequest{AgentID: "late", IP: "198.18.0.99", MeshAddr: "198.18.0.99:6783"})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents[:2] {
		testutil.Eventually(t, 0, "agents 1-2 program the late agent", testutil.True(func() bool { return programmedPeers(a.Agent)["late"] }))
	}
	m.Close()

	// Agent 3 restarts with no master: it programs from its persisted state,
	// and learns "late" from gossip.
	agents[2] = startAgent(t, hosts[2], url, filepath.Join(dir, "a2"), gnet)
	testutil.Eventually(t, 0, "restarted agent programs its old peers and the late one from gossip", testutil.True(func() bool {
		p := programmedPeers(agents[2].Agent)
		return p["host-1"] && p["host-2"] && p["late"]
	}))
	if agents[2].Peers().MastersReachable {
		t.Error("masters reported reachable while down")
	}
	lvx := late.Overlays[0].Backend.VXLAN
	testutil.Eventually(t, 0, "host 3's kernel holds the late agent", testutil.True(func() bool {
		return kernelHasPeer(t, hosts[2], stripPrefix(lvx.VTEPIP), lvx.VTEPMAC, "198.18.0.99", late.Overlays[0].Subnet)
	}))
	// Its own overlay stays OK from the persisted leases.
	if ov := agents[2].Overlay().Overlay("carve"); ov == nil || ov.State.Status != api.StatusOK {
		t.Errorf("restarted agent's overlay: %+v", ov)
	}
}

func stripPrefix(p string) string {
	ip, _, err := net.ParseCIDR(p)
	if err != nil {
		return p
	}
	return ip.String()
}

// TestMeshForgetsDeletedAndMovedPeers: the router keeps trying every mesh
// address it is given, so an agent deleted at the masters, or one that
// moved to another address, must be forgotten, or retries grow with churn.
func TestMeshForgetsDeletedAndMovedPeers(t *testing.T) {
	hosts, dir, m := hostsWithMaster(t, 1)
	gnet := fakegossip.New(fakegossip.Config{Seed: 14})
	t.Cleanup(gnet.Close)
	a := startAgent(t, hosts[0], "http://"+m.HTTPAddr(), filepath.Join(dir, "a0"), gnet)
	router := a.router.(*fakegossip.Router)
	cl := masterClient(t, m)
	ctx := context.Background()
	for _, r := range []api.RegisterRequest{
		{AgentID: "gone", IP: "198.18.5.1", MeshAddr: "198.18.5.1:6783"},
		{AgentID: "moving", IP: "198.18.5.2", MeshAddr: "198.18.5.2:6783"},
	} {
		if _, err := cl.Register(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	targets := func(want ...string) func() error {
		return func() error {
			if got := router.Targets(); !slices.Equal(got, want) {
				return fmt.Errorf("router targets %v, want %v", got, want)
			}
			return nil
		}
	}
	testutil.Eventually(t, 0, "the router is given both peers", targets("198.18.5.1:6783", "198.18.5.2:6783"))
	if err := cl.DeleteAgent(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Register(ctx, api.RegisterRequest{AgentID: "moving", IP: "198.18.5.3", MeshAddr: "198.18.5.3:6783"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the deleted peer and the old address are forgotten", targets("198.18.5.3:6783"))
}
