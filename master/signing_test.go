package master

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
)

func cloneInfo(t *testing.T, a *api.AgentInfo) *api.AgentInfo {
	t.Helper()
	data, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var out api.AgentInfo
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// Every record and tombstone a secure cluster shows verifies with
// signing.pub, the key the state carries is that one, and changing any
// signed field breaks the signature.
func TestSignedRecordsAndTombstones(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	cfg := netconfig.WithDefaults(api.NetworkConfig{Overlays: []api.OverlayNetwork{api.OverlayNetwork{Name: "carve", Subnet: "10.128.0.0/9", Prefix: 24},
		api.OverlayNetwork{Name: "six", Subnet6: "fd00::/48", Prefix6: 64},
		api.OverlayNetwork{Name: "dual", Subnet: "10.1.0.0/16", Prefix: 24, Subnet6: "fd01::/48", Prefix6: 64}}})
	c := newTestClusterWith(t, 3, cfg, p)
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	pub, err := pki.LoadVerifyKey(filepath.Join(p.Dir, pki.SignPub))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op := c.client(follower)
	var answers []*api.AgentInfo
	for i := range 6 {
		req := api.RegisterRequest{AgentID: fmt.Sprintf("a%d", i), Hostname: fmt.Sprintf("h%d", i), IP: fmt.Sprintf("198.18.0.%d", i+1),
			MeshAddr: fmt.Sprintf("198.18.0.%d:6783", i+1), NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: i%2 == 0}}
		info, err := op.Register(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := op.Register(ctx, req) // unchanged: answered without a log entry
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, info, again)
	}
	if _, err := op.DeleteAgents(ctx, []string{"a4", "a5"}); err != nil {
		t.Fatal(err)
	}
	got, err := op.Agent(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	answers = append(answers, got)
	c.waitConverged() // every master's state, signatures included, is byte-identical

	st, err := c.clientAs(follower, "a0", pki.RoleAgent).State(ctx, apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := api.EncodeSigningKey(pub); st.SigningKey != want {
		t.Fatalf("state signing_key %q, want signing.pub %q", st.SigningKey, want)
	}
	key, err := api.ParseSigningKey(st.SigningKey)
	if err != nil || !key.Equal(pub) {
		t.Fatalf("signing_key does not parse to signing.pub: %v", err)
	}
	if len(st.Agents) != 4 || len(st.Tombstones) != 2 || st.ClusterID == "" {
		t.Fatalf("state: %d agents, %d tombstones, cluster id %q", len(st.Agents), len(st.Tombstones), st.ClusterID)
	}
	for i := range st.Agents {
		if err := api.VerifyRecord(pub, &st.Agents[i], st.ClusterID); err != nil {
			t.Errorf("state: %v", err)
		}
	}
	for _, tb := range st.Tombstones {
		if err := api.VerifyTombstone(pub, tb, st.ClusterID); err != nil {
			t.Errorf("state: %v", err)
		}
	}
	for _, a := range answers {
		if err := api.VerifyRecord(pub, a, st.ClusterID); err != nil {
			t.Errorf("answer: %v", err)
		}
	}

	rec := &st.Agents[0] // a0: both bridges, three overlays
	mutations := []struct {
		name   string
		change func(a *api.AgentInfo)
	}{
		{"agent_id", func(a *api.AgentInfo) { a.AgentID = "a9" }},
		{"ip", func(a *api.AgentInfo) { a.IP = "198.18.0.99" }},
		{"mesh_addr", func(a *api.AgentInfo) { a.MeshAddr = "198.18.0.99:6783" }},
		{"version", func(a *api.AgentInfo) { a.Version++ }},
		{"overlay name", func(a *api.AgentInfo) { a.Overlays[0].Info.Name = "other" }},
		{"vtep ip6", func(a *api.AgentInfo) { a.Overlays[0].Backend.VXLAN.VTEPIP6 = "fd01:a::9/64" }},
		{"subnet", func(a *api.AgentInfo) { a.Overlay("carve").Subnet = "128.0.0.0/1" }},
		{"subnet6", func(a *api.AgentInfo) { a.Overlay("six").Subnet6 = "::/1" }},
		{"mesos bridge ip", func(a *api.AgentInfo) { a.Overlay("carve").MesosBridge.IP = "10.128.0.0/26" }},
		{"mesos bridge ip6", func(a *api.AgentInfo) { a.Overlay("six").MesosBridge.IP6 = "fd00::/66" }},
		{"docker bridge ip", func(a *api.AgentInfo) { a.Overlay("dual").DockerBridge.IP = "10.1.0.0/26" }},
		{"docker bridge ip6", func(a *api.AgentInfo) { a.Overlay("dual").DockerBridge.IP6 = "fd01::/66" }},
		{"vtep ip", func(a *api.AgentInfo) { a.Overlays[0].Backend.VXLAN.VTEPIP = "198.18.0.1/32" }},
		{"vtep mac", func(a *api.AgentInfo) { a.Overlays[0].Backend.VXLAN.VTEPMAC = "70:b3:d5:ff:ff:ff" }},
		{"an overlay dropped", func(a *api.AgentInfo) { a.Overlays = a.Overlays[1:] }},
		{"a bridge dropped", func(a *api.AgentInfo) { a.Overlay("carve").MesosBridge = nil }},
		{"signature of another record", func(a *api.AgentInfo) { a.Signature = st.Agents[1].Signature }},
		{"no signature", func(a *api.AgentInfo) { a.Signature = "" }},
	}
	for _, m := range mutations {
		changed := cloneInfo(t, rec)
		m.change(changed)
		if err := api.VerifyRecord(pub, changed, st.ClusterID); !errors.Is(err, api.ErrBadSignature) {
			t.Errorf("record with a changed %s: %v, want ErrBadSignature", m.name, err)
		}
	}
	if err := api.VerifyRecord(pub, rec, "another-cluster"); !errors.Is(err, api.ErrBadSignature) {
		t.Errorf("record under another cluster id: %v", err)
	}
	// Overlay order is not signed: the encoding sorts them.
	reordered := cloneInfo(t, rec)
	reordered.Overlays[0], reordered.Overlays[2] = reordered.Overlays[2], reordered.Overlays[0]
	if err := api.VerifyRecord(pub, reordered, st.ClusterID); err != nil {
		t.Errorf("record with reordered overlays: %v", err)
	}
	tb := st.Tombstones[0]
	for name, change := range map[string]func(*api.Tombstone){
		"agent_id": func(t *api.Tombstone) { t.AgentID = "a0" },
		"version":  func(t *api.Tombstone) { t.Version = 1<<64 - 1 },
	} {
		changed := tb
		change(&changed)
		if err := api.VerifyTombstone(pub, changed, st.ClusterID); !errors.Is(err, api.ErrBadSignature) {
			t.Errorf("tombstone with a changed %s: %v", name, err)
		}
	}
	if err := api.VerifyTombstone(pub, tb, "another-cluster"); !errors.Is(err, api.ErrBadSignature) {
		t.Errorf("tombstone under another cluster id: %v", err)
	}
	// A record's signature is no tombstone's.
	if err := api.VerifyTombstone(pub, api.Tombstone{AgentID: rec.AgentID, Version: rec.Version, Signature: rec.Signature}, st.ClusterID); err == nil {
		t.Error("a record's signature verifies as a tombstone's")
	}
}
