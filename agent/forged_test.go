package agent

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/mastertest"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// mute is a gossip peer that says only what it is told to broadcast.
type mute struct{ parrot }

func (mute) Gossip() gossip.Data { return nil }

// reconcileCount reads how many reconciles of a mode (apply, resync) ended,
// from the agent's registry (package kernel counts them).
func reconcileCount(t *testing.T, a *Agent, mode string) uint64 {
	t.Helper()
	families, err := a.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "carve_agent_reconcile_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "mode" && l.GetValue() == mode {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// readKernel reads the VTEP and carve's entries in host's kernel.
func readKernel(t *testing.T, host *netnslab.Host) *labcluster.KernelState {
	t.Helper()
	ks, err := labcluster.ReadKernel(host.Namespace, state.DefaultVTEPName)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// signRecord is info signed with key for cluster, as a gossiped record.
func signRecord(info api.AgentInfo, key ed25519.PrivateKey, cluster string) membership.PeerRecord {
	info.Signature = api.Sign(key, api.RecordSigningBytes(&info, cluster))
	return membership.NewPeerRecord(&info)
}

// copyInfo deep-copies a record, so that a forgery never touches the original.
func copyInfo(t *testing.T, info *api.AgentInfo) api.AgentInfo {
	t.Helper()
	var out api.AgentInfo
	data, err := json.Marshal(info)
	if err == nil {
		err = json.Unmarshal(data, &out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startSecureAgent runs host's agent against a master that serves TLS and
// signs records: an agent certificate of the master's CA, a mesh password
// (the fake network ignores it), not --insecure.
func startSecureAgent(t *testing.T, host *netnslab.Host, ms *mastertest.Secure, dataDir string, gnet *fakegossip.Network, opts ...func(*Config)) *runningAgent {
	t.Helper()
	ms.CA.IssueAgent(fmt.Sprintf("host-%d", host.Index), host.IP.Addr())
	return runAgent(t, newTestAgent(t, host, ms.URL(), dataDir, gnet, append([]func(*Config){func(c *Config) {
		c.TLS, c.MeshPassword, c.Insecure = ms.CA.Files(fmt.Sprintf("host-%d", host.Index), pki.RoleAgent), []byte("s3cret"), false
	}}, opts...)...))
}

// TestForgedGossipChangesNothing: two agents follow a master that serves
// TLS and signs records; a peer on their gossip network sends forged,
// altered, replayed, out-of-range and foreign records and tombstones.
// Each is refused and counted under its reason on both agents, and
// neither agent's membership nor kernel changes: the membership is read
// once the refusal is counted, the kernel after a full resync that
// started after that.
func TestForgedGossipChangesNothing(t *testing.T) {
	t.Parallel() // its own namespaces, masters and data dirs
	hosts, dir, _ := hostsWithMaster(t, 2)
	ms := mastertest.StartSecure(t, filepath.Join(dir, "secure-m1"), state.DefaultConfig(), quietLogger())
	op, err := apiclient.NewClientWith([]string{ms.URL()}, apiclient.ClientOptions{TLS: ms.CA.ClientTLS("op", pki.RoleOperator)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// "old" registers, then moves: its first record is a genuine, older
	// signed record the agents have seen replaced.
	oldV1, err := op.Register(ctx, api.RegisterRequest{AgentID: "old", IP: "198.18.5.1", MeshAddr: "198.18.5.1:6783"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Register(ctx, api.RegisterRequest{AgentID: "old", IP: "198.18.5.2", MeshAddr: "198.18.5.2:6783"}); err != nil {
		t.Fatal(err)
	}

	gnet := fakegossip.New(fakegossip.Config{Seed: 31})
	t.Cleanup(gnet.Close)
	t.Logf("fake gossip seed %d", gnet.Seed())
	agents := make([]*runningAgent, len(hosts))
	// Each forgery waits for two full resyncs: a short period keeps the
	// fourteen of them quick (the default of the tests is a second).
	fastResync := func(c *Config) { c.ResyncInterval = 200 * time.Millisecond }
	for i, h := range hosts {
		agents[i] = startSecureAgent(t, h, ms, filepath.Join(dir, fmt.Sprintf("a%d", i)), gnet, fastResync)
	}
	for i, a := range agents {
		other := fmt.Sprintf("host-%d", hosts[1-i].Index)
		testutil.Eventually(t, 0, fmt.Sprintf("agent %d programs %s and old", i, other), testutil.True(func() bool {
			p := programmedPeers(a.Agent)
			return len(p) == 2 && p[other] && p["old"]
		}))
	}
	st, err := op.State(ctx, apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var h2 *api.AgentInfo
	for i := range st.Agents {
		if st.Agents[i].AgentID == "host-2" {
			h2 = &st.Agents[i]
		}
	}
	if h2 == nil || h2.Signature == "" || st.ClusterID == "" {
		t.Fatalf("the master's state lacks host-2's signed record or a cluster id: %+v", st)
	}
	// Snapshots, once a full resync has run on the converged state.
	members := make([]membership.State, len(agents))
	kernels := make([]*labcluster.KernelState, len(agents))
	// waitResync waits until every agent ended two more full resyncs: at
	// least one started after the call.
	waitResync := func(t *testing.T) {
		t.Helper()
		n := make([]uint64, len(agents))
		for i, a := range agents {
			n[i] = reconcileCount(t, a.Agent, "resync")
		}
		for i, a := range agents {
			testutil.Eventually(t, 0, fmt.Sprintf("agent %d resyncs its kernel", i), testutil.True(func() bool {
				return reconcileCount(t, a.Agent, "resync") >= n[i]+2
			}))
		}
	}
	waitResync(t)
	for i, a := range agents {
		members[i], kernels[i] = a.members.State(), readKernel(t, hosts[i])
		if len(kernels[i].Routes) != 2 {
			t.Fatalf("host %d's kernel before the forgeries: %s", i+1, kernels[i])
		}
	}

	key := ms.CA.SigningKey
	_, otherKey := testKey(t)
	cluster := st.ClusterID
	evil := func(mutate func(*api.AgentInfo)) api.AgentInfo {
		info := copyInfo(t, h2)
		info.AgentID, info.IP, info.MeshAddr, info.Version, info.Signature = "evil", "198.18.6.66", "198.18.6.66:6783", 1<<40, ""
		if mutate != nil {
			mutate(&info)
		}
		return info
	}
	overlay := func(f func(*api.AgentOverlay)) func(*api.AgentInfo) {
		return func(a *api.AgentInfo) { f(&a.Overlays[0]) }
	}
	h2Changed := func(f func(*membership.PeerRecord)) membership.PeerRecord {
		r := membership.NewPeerRecord(h2)
		r.Overlays = append([]membership.PeerOverlay(nil), r.Overlays...)
		f(&r)
		return r
	}
	unsignedEvil := membership.NewPeerRecord(func() *api.AgentInfo { i := evil(nil); return &i }())
	// marker is refused as unsigned: it shows that a message whose other
	// content is genuine was received and processed.
	marker := rec("marker", 1, "198.18.7.1")
	msg := func(cluster string, recs []membership.PeerRecord, tombs ...api.Tombstone) membership.Message {
		return membership.Message{ClusterID: cluster, State: membership.State{Records: recs, Tombstones: tombs}}
	}
	rerendered := copyInfo(t, h2) // a configuration change re-renders at the same version
	rerendered.MeshAddr = "198.18.9.9:6783"
	forgeries := []struct {
		name   string
		msg    membership.Message
		reason string
	}{
		{"unsigned record of a new agent", msg(cluster, []membership.PeerRecord{unsignedEvil}), membership.RefusedUnsigned},
		{"unsigned newer copy of a known agent", msg(cluster, []membership.PeerRecord{h2Changed(func(r *membership.PeerRecord) {
			r.Signature, r.Version, r.Overlays[0].Subnet = "", r.Version+1, "10.128.200.0/24"
		})}), membership.RefusedUnsigned},
		{"signed record with a changed subnet", msg(cluster, []membership.PeerRecord{h2Changed(func(r *membership.PeerRecord) {
			r.Version, r.Overlays[0].Subnet = r.Version+1000, "10.128.200.0/24"
		})}), membership.RefusedBadSignature},
		{"signed record replayed with a huge version", msg(cluster, []membership.PeerRecord{h2Changed(func(r *membership.PeerRecord) { r.Version = math.MaxUint64 })}), membership.RefusedBadSignature},
		{"older signed record replayed", msg(cluster, []membership.PeerRecord{membership.NewPeerRecord(oldV1), marker}), membership.RefusedUnsigned},
		{"unsigned huge-version tombstone", msg(cluster, nil, api.Tombstone{AgentID: "host-2", Version: math.MaxUint64}), membership.RefusedUnsigned},
		{"huge-version tombstone signed by another key", msg(cluster, nil, signedTombstone(otherKey, cluster, "host-2", math.MaxUint64)), membership.RefusedBadSignature},
		{"record signed by another key", msg(cluster, []membership.PeerRecord{signRecord(evil(nil), otherKey, cluster)}), membership.RefusedBadSignature},
		{"record of another cluster", msg("another-cluster", []membership.PeerRecord{signRecord(evil(nil), key, "another-cluster")}), membership.RefusedOtherCluster},
		{"record signed for another cluster, sent as this one's", msg(cluster, []membership.PeerRecord{signRecord(evil(nil), key, "another-cluster")}), membership.RefusedBadSignature},
		{"signed, subnet outside the overlays", msg(cluster, []membership.PeerRecord{signRecord(evil(overlay(func(o *api.AgentOverlay) {
			o.Subnet, o.MesosBridge, o.DockerBridge = "128.0.0.0/1", nil, nil
		})), key, cluster)}), membership.RefusedOutOfRange},
		{"signed, VTEP outside vtep_subnet", msg(cluster, []membership.PeerRecord{signRecord(evil(overlay(func(o *api.AgentOverlay) {
			o.Backend.VXLAN.VTEPIP, o.Backend.VXLAN.VTEPMAC = "198.18.0.1/16", "70:b3:d5:12:00:01"
		})), key, cluster)}), membership.RefusedOutOfRange},
		{"signed, MAC not derived from the VTEP IP", msg(cluster, []membership.PeerRecord{signRecord(evil(overlay(func(o *api.AgentOverlay) {
			o.Backend.VXLAN.VTEPIP = "100.64.9.9/16" // MAC left as host-2's
		})), key, cluster)}), membership.RefusedOutOfRange},
		{"signed re-rendering at the same version: the masters' copy stays", msg(cluster, []membership.PeerRecord{signRecord(rerendered, key, cluster), marker}), membership.RefusedUnsigned},
	}

	rogue, err := gnet.Join("rogue")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := rogue.Channel(GossipChannel, mute{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forgeries {
		t.Run(f.name, func(t *testing.T) {
			data, err := json.Marshal(f.msg)
			if err != nil {
				t.Fatal(err)
			}
			before := make([]float64, len(agents))
			for i, a := range agents {
				before[i] = refusedCount(t, a.Agent, f.reason)
			}
			ch.Broadcast(rawData(data))
			for i, a := range agents {
				testutil.Eventually(t, 0, fmt.Sprintf("agent %d counts the refusal (%s)", i, f.reason), testutil.True(func() bool {
					return refusedCount(t, a.Agent, f.reason) > before[i]
				}))
				if got := a.members.State(); !reflect.DeepEqual(got, members[i]) {
					t.Errorf("agent %d's membership changed:\n got %+v\nwant %+v", i, got, members[i])
				}
			}
			waitResync(t)
			for i := range agents {
				if got := readKernel(t, hosts[i]); !reflect.DeepEqual(got, kernels[i]) {
					t.Errorf("host %d's kernel changed:\n got %s\nwant %s", i+1, got, kernels[i])
				}
			}
		})
	}
}
