//go:build !race

// Real mesh routers over TCP on 127.0.0.1 carrying the agent's membership
// gossip. mesh has data races the race detector reports, so this runs only
// without -race (as gossip/*_tcp_test.go).

package agent

import (
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/agent/meshpeers"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/test/lab/meshtest"
	"github.com/carve-net/carve/test/lab/testutil"
)

// meshAgent is the gossip side of an agent (its membership, trust and
// handler) on a real mesh router.
type meshAgent struct {
	a      *Agent
	router *gossip.MeshRouter
	addr   string
	deaf   *atomic.Bool
}

func startMeshAgent(t *testing.T, id, cluster string, key ed25519.PublicKey, network *api.NetworkConfig, k int) *meshAgent {
	t.Helper()
	a := &Agent{id: id, log: slog.New(slog.DiscardHandler), members: membership.New(), metrics: newMetrics(prometheus.NewRegistry()),
		sec: &security{}, clusterID: cluster, signingKey: key, network: network, refusals: newLogLimiter(time.Minute),
		reconcileCh: make(chan struct{}, 1), persistCh: make(chan struct{}, 1), connectCh: make(chan struct{}, 1),
		meshPeers: meshpeers.New(id, k)}
	deaf := &atomic.Bool{}
	r, addr := meshtest.Start(t, id, gossip.MeshConfig{NoDiscovery: true, GossipInterval: 200 * time.Millisecond}, func(r *gossip.MeshRouter) (err error) {
		a.channel, err = r.Channel(GossipChannel, meshtest.Deaf((*gossipHandler)(a), deaf))
		return err
	})
	a.router = r
	return &meshAgent{a: a, router: r, addr: addr, deaf: deaf}
}

// meshRecord is agent i's record, signed, with its mesh address.
func meshRecord(priv ed25519.PrivateKey, cluster string, i int, addr string, v uint64) membership.PeerRecord {
	return signedPeer(priv, cluster, func(info *api.AgentInfo) {
		info.AgentID = fmt.Sprintf("agent-%02d", i)
		info.IP = fmt.Sprintf("198.18.1.%d", i+1)
		info.MeshAddr = addr
		info.Version = v
		ov := &info.Overlays[0]
		ov.Subnet = fmt.Sprintf("10.128.%d.0/24", i+2)
		ov.MesosBridge = &api.BridgeInfo{Name: "m-carve", IP: fmt.Sprintf("10.128.%d.0/25", i+2)}
		ov.DockerBridge = &api.BridgeInfo{Name: "d-carve", IP: fmt.Sprintf("10.128.%d.128/25", i+2)}
		ov.Backend.VXLAN.VTEPIP = fmt.Sprintf("100.64.1.%d/16", i+1)
		ov.Backend.VXLAN.VTEPMAC = fmt.Sprintf("70:b3:d5:40:01:%02x", i+1)
	})
}

// TestMeshBoundedConnectionsDeltasAndAntiEntropy: 30 agents on real mesh
// routers, each dialling only the 3 peers package meshpeers chooses (mesh's
// discovery off), form one topology; a change broadcast as a delta reaches
// all of them through it; while a third of them is cut off (drops all it
// receives), each side learns something the other lacks, and after the
// partition heals both sides converge through anti-entropy alone (digests
// and unicast pushes, no broadcast), every record checked against the
// masters' signature.
func TestMeshBoundedConnectionsDeltasAndAntiEntropy(t *testing.T) {
	// 30 real mesh routers, their connections and their gossip rounds
	// on a machine at load 35 (a CI run beside other work) took longer
	// than testutil's 30 s to carry a change across the reachable side.
	const meshConverge = 2 * time.Minute
	const n, k = 30, 3
	pub, priv := testKey(t)
	network := state.DefaultConfig()
	var agents []*meshAgent
	var st membership.State
	for i := range n {
		ma := startMeshAgent(t, fmt.Sprintf("agent-%02d", i), "c1", pub, &network, k)
		agents = append(agents, ma)
		st.Records = append(st.Records, meshRecord(priv, "c1", i, ma.addr, 10))
	}
	for _, ma := range agents {
		if news := ma.a.members.MergeFromMasters(st); len(news.Records) != n {
			t.Fatalf("%s merged %d records", ma.a.id, len(news.Records))
		}
		ma.a.connectPeers()
		if got := int(gaugeValue(t, ma.a.metrics.meshTargets)); got != k {
			t.Fatalf("%s dials %d peers, want %d", ma.a.id, got, k)
		}
	}
	testutil.Eventually(t, meshConverge, "the topology spans every agent", func() error {
		for _, ma := range agents {
			if got := ma.router.Peers(); len(got) != n-1 {
				return fmt.Errorf("%s knows %d peers", ma.a.id, len(got))
			}
		}
		return nil
	})
	edges := 0
	for _, ma := range agents {
		edges += len(ma.router.Neighbours())
	}
	if edges > 2*n*k {
		t.Fatalf("%d connection ends among %d agents dialling %d each: more than %d", edges, n, k, 2*n*k)
	}
	t.Logf("%d connection ends (a full mesh has %d)", edges, n*(n-1))

	has := func(ma *meshAgent, r membership.PeerRecord) bool {
		got, ok := ma.a.members.Record(r.ID)
		return ok && got.Equal(&r)
	}
	// A delta broadcast reaches everyone.
	changed := meshRecord(priv, "c1", 7, agents[7].addr, 11)
	agents[0].a.members.MergeFromMasters(membership.State{Records: []membership.PeerRecord{changed}})
	agents[0].a.channel.Broadcast(agents[0].a.gossipData(membership.State{Records: []membership.PeerRecord{changed}}))
	testutil.Eventually(t, meshConverge, "every agent has the broadcast change", func() error {
		for _, ma := range agents {
			if !has(ma, changed) {
				return fmt.Errorf("%s has not", ma.a.id)
			}
		}
		return nil
	})

	// A partition: agents 20-29 hear nothing. Each side learns a change;
	// the cut-off side's is merged locally, never broadcast.
	for _, ma := range agents[20:] {
		ma.deaf.Store(true)
	}
	north := meshRecord(priv, "c1", 3, agents[3].addr, 12)
	agents[1].a.members.MergeFromMasters(membership.State{Records: []membership.PeerRecord{north}})
	agents[1].a.channel.Broadcast(agents[1].a.gossipData(membership.State{Records: []membership.PeerRecord{north}}))
	south := meshRecord(priv, "c1", 25, agents[25].addr, 13)
	gone := signedTombstone(priv, "c1", "agent-26", 14)
	for _, ma := range agents[20:] {
		ma.a.members.MergeFromMasters(membership.State{Records: []membership.PeerRecord{south}, Tombstones: []api.Tombstone{gone}})
	}
	testutil.Eventually(t, meshConverge, "the reachable side has the north change", func() error {
		for _, ma := range agents[:20] {
			if !has(ma, north) {
				return fmt.Errorf("%s has not", ma.a.id)
			}
		}
		return nil
	})
	for _, ma := range agents[20:] {
		if has(ma, north) {
			t.Fatalf("%s heard the north change through the partition", ma.a.id)
		}
	}
	// A forged record on the way is refused by every agent.
	forged := meshRecord(priv, "c1", 5, agents[5].addr, 99)
	forged.IP = "198.18.9.9"
	agents[2].a.members.Merge(membership.State{Records: []membership.PeerRecord{forged}})

	for _, ma := range agents[20:] {
		ma.deaf.Store(false)
	}
	testutil.Eventually(t, meshConverge, "every agent converges after the partition heals", func() error {
		for _, ma := range agents {
			if !has(ma, north) || !has(ma, south) {
				return fmt.Errorf("%s lacks a change", ma.a.id)
			}
			if v, ok := ma.a.members.Tombstone("agent-26"); !ok || v != 14 {
				return fmt.Errorf("%s lacks the tombstone", ma.a.id)
			}
		}
		return nil
	})
	for _, ma := range agents {
		if ma == agents[2] {
			continue
		}
		if r, _ := ma.a.members.Record("agent-05"); r.Version == 99 {
			t.Fatalf("%s took the forged record", ma.a.id)
		}
	}
	var pushes float64
	for _, ma := range agents {
		var m dto.Metric
		if err := ma.a.metrics.gossipSent.WithLabelValues(GossipChannel, "push").Write(&m); err != nil {
			t.Fatal(err)
		}
		pushes += m.GetCounter().GetValue()
	}
	if pushes == 0 {
		t.Fatal("no anti-entropy push was sent: the convergence came from elsewhere")
	}
}
