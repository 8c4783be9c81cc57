package ipam

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/test/lab/fakegossip"
)

// Three agents a, b, c on an overlay 10.128.0.0/24 (and fd00::/48), each
// leased a /26 (a /64) cut in two bridges: a mesos /27 holds 29 containers.
// The last /26 is leased to nobody: the masters' stand-in says exhausted.
var growthAgents = map[string]int{"a": 0, "b": 1, "c": 2}

func growthSelf(id string) *api.AgentInfo {
	i := growthAgents[id]
	base := netip.AddrFrom4([4]byte{10, 128, 0, byte(64 * i)})
	mesos := netip.PrefixFrom(base, 27)
	docker := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, 0, byte(64*i + 32)}), 27)
	sub6 := fmt.Sprintf("fd00:0:0:%d::/64", i+1)
	return &api.AgentInfo{AgentID: id, IP: fmt.Sprintf("198.18.0.%d", 10+i), Version: uint64(10 + i), Overlays: []api.AgentOverlay{{
		Info:         api.OverlayNetwork{Name: "carve", Subnet: "10.128.0.0/24", Prefix: 26, Subnet6: "fd00::/48", Prefix6: 64},
		Subnet:       netip.PrefixFrom(base, 26).String(),
		Subnet6:      sub6,
		MesosBridge:  &api.BridgeInfo{Name: "m-carve", IP: mesos.String(), IP6: fmt.Sprintf("fd00:0:0:%d::/65", i+1)},
		DockerBridge: &api.BridgeInfo{Name: "d-carve", IP: docker.String()},
		State:        api.OverlayState{Status: api.StatusOK},
	}}}
}

// growthView is agent id's view: every agent's record, with its claim
// key (attributed claims on: each node signs with claimKeyOf).
func growthView(id string) View {
	v := View{ClusterID: "c1", Self: growthSelf(id), Network: &api.NetworkConfig{OverlayMTU: 1400}}
	for _, p := range []string{"a", "b", "c"} {
		peer := peerOf(growthSelf(p))
		peer.ClaimKey = claimKeyOf(p).Public().(ed25519.PublicKey)
		v.Peers = append(v.Peers, peer)
	}
	return v
}

// claimKeyOf is agent id's claim key, derived from its id.
func claimKeyOf(id string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("claim key of " + id))
	return ed25519.NewKeyFromSeed(seed[:])
}

// mastersStandIn is a TEST DOUBLE standing in for the masters (whose grow,
// return and grant routes are another change's): it has no free block
// (ErrMastersExhausted), and records the grants and returns reported.
type mastersStandIn struct {
	mu      sync.Mutex
	grants  []GrantReport
	returns []ReturnReport
	down    bool
}

func (m *mastersStandIn) Grow(context.Context, string, string, int, string) (LeasedBlock, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down {
		return LeasedBlock{}, fmt.Errorf("no master answered")
	}
	return LeasedBlock{}, ErrMastersExhausted
}

func (m *mastersStandIn) Return(_ context.Context, r ReturnReport) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down {
		return fmt.Errorf("no master answered")
	}
	m.returns = append(m.returns, r)
	return nil
}

func (m *mastersStandIn) ReportGrant(_ context.Context, g GrantReport) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down {
		return fmt.Errorf("no master answered")
	}
	m.grants = append(m.grants, g)
	return nil
}

func (m *mastersStandIn) reported() []GrantReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]GrantReport(nil), m.grants...)
}

// node is one agent's IPAM on its own store, on a shared gossip network.
type node struct {
	id      string
	dir     string
	db      *bolt.DB
	reg     *prometheus.Registry
	svc     *Service
	cancel  context.CancelFunc
	done    chan struct{}
	changes chan struct{}
}

type cluster struct {
	t       *testing.T
	net     *fakegossip.Network
	masters *mastersStandIn
	// source, when set, is agent id's BlockSource instead of masters
	// (its client of the masters, which names it).
	source func(id string) BlockSource
	// view, when set, is an agent's first view instead of growthView's
	// (and of the stand-in's grants).
	view   func(id string) View
	nodes  map[string]*node
	growth GrowthConfig
}

func newCluster(t *testing.T, seed uint64, growth GrowthConfig) *cluster {
	t.Helper()
	n := fakegossip.New(fakegossip.Config{Seed: seed, MaxDelay: time.Millisecond, Logger: testLogger()})
	t.Cleanup(n.Close)
	c := &cluster{t: t, net: n, masters: &mastersStandIn{}, nodes: map[string]*node{}, growth: growth}
	return c
}

// start starts (or restarts) an agent's IPAM on the store in dir.
func (c *cluster) start(id, dir, cniCache string) *node {
	c.t.Helper()
	if old := c.nodes[id]; old != nil {
		c.stop(id)
	}
	db, err := bolt.Open(filepath.Join(dir, "agent.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	nd := &node{id: id, dir: dir, db: db, reg: prometheus.NewRegistry(), done: make(chan struct{}), changes: make(chan struct{}, 1)}
	cfg := c.growth
	cfg.Source = c.masters
	if c.source != nil {
		cfg.Source = c.source(id)
	}
	cfg.Seed = uint64(len(id)) + 7
	cfg.OnChange = func() {
		select {
		case nd.changes <- struct{}{}:
		default:
		}
	}
	nd.svc, err = New(Config{AgentID: id, DB: db, CNICacheDir: cniCache, Registerer: nd.reg, Logger: testLogger(), Growth: cfg, ClaimKey: claimKeyOf(id)})
	if err != nil {
		c.t.Fatal(err)
	}
	r, err := c.net.Join(id)
	if err != nil {
		c.t.Fatal(err)
	}
	ch, err := r.Channel(RingChannel, nd.svc.RingGossip())
	if err != nil {
		c.t.Fatal(err)
	}
	nd.svc.UseChannel(ch)
	v := growthView(id)
	if c.view != nil {
		v = c.view(id)
	}
	// As the masters' record does, the view lists the grants to this
	// agent that the masters recorded (a restart with a lost data dir
	// takes them back from there: mayAdopt).
	for _, g := range c.masters.reported() {
		if g.Recipient == id && c.view == nil {
			bridge := g.Bridge
			if bridge == "" {
				bridge = api.BridgeMesos
			}
			v.Blocks = append(v.Blocks, MasterBlock{Overlay: g.Overlay, Bridge: bridge, Prefix: g.Prefix, Version: 1, Donor: g.Donor})
		}
	}
	nd.svc.Sync(v)
	ctx, cancel := context.WithCancel(context.Background())
	nd.cancel = cancel
	go func() {
		nd.svc.Run(ctx)
		close(nd.done)
	}()
	c.nodes[id] = nd
	c.t.Cleanup(func() { c.stop(id) })
	return nd
}

// stop stops an agent (its store closed); what is in flight to it is lost.
func (c *cluster) stop(id string) {
	nd := c.nodes[id]
	if nd == nil || nd.cancel == nil {
		return
	}
	c.net.Leave(id)
	nd.cancel()
	<-nd.done
	nd.cancel = nil
	// Quiesce: no commit in flight when the store closes.
	nd.svc.commits.Quiesce()
	nd.svc.mu.Unlock()
	nd.svc.commits.Release()
	nd.db.Close()
	delete(c.nodes, id)
}

// gossipRounds lets the rings converge.
func (c *cluster) gossipRounds() {
	c.t.Helper()
	for range 3 {
		c.net.GossipRound()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.net.WaitIdle(ctx)
		cancel()
		if err != nil {
			c.t.Fatal(err)
		}
	}
}

func (nd *node) alloc(t *testing.T, cid string) *api.Allocation {
	t.Helper()
	a, err := nd.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0", Bridge: api.BridgeMesos})
	if err != nil {
		t.Fatalf("%s: allocate %s: %v", nd.id, cid, err)
	}
	return a
}

// v4 returns an allocation's IPv4 address and prefix, and its gateway.
func v4(t *testing.T, a *api.Allocation) (netip.Prefix, netip.Addr) {
	t.Helper()
	for _, ip := range a.IPs {
		p := netip.MustParsePrefix(ip.Address)
		if p.Addr().Is4() {
			return p, netip.MustParseAddr(ip.Gateway)
		}
	}
	t.Fatalf("no IPv4 address in %+v", a)
	return netip.Prefix{}, netip.Addr{}
}

// checkNoDoubles fails when an address is held by two agents, or by one
// that the ring of another agent does not give it.
func (c *cluster) checkNoDoubles() {
	c.t.Helper()
	holder := map[netip.Addr]string{}
	for id, nd := range c.nodes {
		for _, al := range nd.svc.List("carve").Allocations {
			for _, ip := range al.IPs {
				addr := netip.MustParsePrefix(ip.Address).Addr()
				if other, dup := holder[addr]; dup {
					c.t.Fatalf("%s is held by %s and by %s", addr, other, id)
				}
				holder[addr] = id
			}
		}
		checkAllocations(c.t, nd.svc)
	}
}

// TestGrowthThroughRing: with the masters out of blocks, an agent whose
// mesos bridge fills gets blocks from its peers through the ring (real
// services, the real gossip handler path): every ADD succeeds, the new
// addresses lie in granted blocks with their own gateway and prefix, the
// peers agree who owns what, no address is held twice, and the grant is
// reported to the masters.
