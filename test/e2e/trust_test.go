package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// TestRogueMeshPeer is issue 8's forged gossip, from a real process: a
// rogue mesh peer (carve-lab rogue-gossip) runs in host 3's namespace,
// joins every agent's mesh address and broadcasts a membership message on
// the agents' channel. Each case starts a new rogue:
//
//   - without the mesh password: every agent refuses the handshake (and
//     counts it), so no gossip crosses;
//   - with the password, unsigned records (a new agent, a changed copy of
//     host 2);
//   - host 2's record as the masters signed it, with its subnet changed and
//     its version raised;
//   - a tombstone of host 2 at version 2^64-1, unsigned and signed with a
//     key that is not the masters'.
//
// After each, every agent's /overlay-agent/peers and kernel are as before,
// and the agents' /metrics count the refusals under their reason.
func TestRogueMeshPeer(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitKernelMatchesMasters(ctx, t, c)
	st, err := c.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h2ID := c.Host(2).AgentID()
	var h2 *api.AgentInfo
	for i := range st.Agents {
		if st.Agents[i].AgentID == h2ID {
			h2 = &st.Agents[i]
		}
	}
	if h2 == nil || h2.Signature == "" || st.ClusterID == "" {
		t.Fatalf("the masters' state lacks %s's signed record or a cluster id", h2ID)
	}
	before := hostViews(ctx, t, c)

	_, otherKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	h2Record := func(change func(*membership.PeerRecord)) membership.PeerRecord {
		r := membership.NewPeerRecord(h2)
		r.Overlays = append([]membership.PeerOverlay(nil), r.Overlays...)
		change(&r)
		return r
	}
	unsignedEvil := membership.NewPeerRecord(&api.AgentInfo{AgentID: "evil", IP: "198.18.6.66", MeshAddr: "198.18.6.66:6783", Version: 1 << 40,
		Overlays: []api.AgentOverlay{{Info: api.OverlayNetwork{Name: "carve"}, Subnet: "10.128.250.0/24", State: api.OverlayState{Status: api.StatusOK},
			Backend: &api.BackendInfo{VXLAN: &api.VXLANInfo{VTEPIP: "100.64.0.250/16", VTEPMAC: "70:b3:d5:40:00:fa"}}}}})
	hugeSigned := api.Tombstone{AgentID: h2ID, Version: math.MaxUint64}
	hugeSigned.Signature = api.Sign(otherKey, api.TombstoneSigningBytes(hugeSigned, st.ClusterID))
	message := func(recs []membership.PeerRecord, tombs ...api.Tombstone) membership.Message {
		return membership.Message{ClusterID: st.ClusterID, State: membership.State{Records: recs, Tombstones: tombs}}
	}
	const meshRefused = "carve_agent_mesh_handshakes_refused_total"
	refused := func(reason string) string { return `carve_agent_gossip_refused_total{reason="` + reason + `"}` }
	cases := []struct {
		name     string
		password bool
		msg      membership.Message
		counters []string // each rises on every agent
	}{
		{"no password", false, message([]membership.PeerRecord{unsignedEvil}), []string{meshRefused}},
		{"password, unsigned records", true, message([]membership.PeerRecord{unsignedEvil, h2Record(func(r *membership.PeerRecord) {
			r.Signature, r.Version, r.Overlays[0].Subnet = "", r.Version+1, "10.128.250.0/24"
		})}), []string{refused("unsigned")}},
		{"password, signed record with a changed subnet", true, message([]membership.PeerRecord{h2Record(func(r *membership.PeerRecord) {
			r.Version, r.Overlays[0].Subnet = r.Version+1000, "10.128.250.0/24"
		})}), []string{refused("bad_signature")}},
		{"password, huge-version tombstones", true, message(nil, api.Tombstone{AgentID: h2ID, Version: math.MaxUint64}, hugeSigned),
			[]string{refused("unsigned"), refused("bad_signature")}},
	}
	dir := t.TempDir()
	for i, tc := range cases {
		ok := t.Run(tc.name, func(t *testing.T) {
			data, err := json.Marshal(tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, fmt.Sprintf("message-%d.json", i))
			if err := os.WriteFile(file, data, 0o644); err != nil {
				t.Fatal(err)
			}
			counts := map[string]map[string]float64{}
			for _, h := range c.Hosts() {
				counts[h.Name] = map[string]float64{}
				for _, name := range tc.counters {
					if counts[h.Name][name], err = agentMetric(ctx, c, h, name); err != nil {
						t.Fatal(err)
					}
				}
			}
			rogue, err := c.StartRogue(c.Host(3), fmt.Sprintf("rogue-%d", i), tc.password, file)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range c.Hosts() {
				for _, name := range tc.counters {
					err := retry.Until(ctx, 200*time.Millisecond, func() error {
						v, err := agentMetric(ctx, c, h, name)
						if err == nil && v <= counts[h.Name][name] {
							err = fmt.Errorf("%s: %s still %v", h.Name, name, v)
						}
						return err
					})
					if err != nil {
						t.Fatalf("the rogue peer's message was not refused: %v\nrogue log:\n%s", err, rogue.Tail(20))
					}
				}
			}
			if err := rogue.Stop(ctx, 0); err != nil {
				t.Error(err)
			}
			if !tc.password && strings.Contains(rogue.Tail(200), "msg=\"mesh peers\"") {
				t.Errorf("the rogue without the password saw mesh peers:\n%s", rogue.Tail(20))
			}
			checkUnchanged(ctx, t, c, before)
		})
		if !ok {
			t.FailNow()
		}
	}
	// The whole cluster still works as the masters say.
	waitKernelMatchesMasters(ctx, t, c)
	if err := c.Converged(ctx); err != nil {
		t.Error(err)
	}
}

// agentMetric reads one sample of h's agent's /metrics: name with its
// labels as the text format writes them (`x_total{reason="unsigned"}`).
func agentMetric(ctx context.Context, c *labcluster.Cluster, h *labcluster.Host, sample string) (float64, error) {
	return metricSample(ctx, c.HTTPClient(), h.AgentURL(), sample)
}

// metricSample reads one sample of the /metrics of the server at base (an
// agent's or a master's URL).
func metricSample(ctx context.Context, hc *http.Client, base, sample string) (float64, error) {
	return labcluster.MetricSample(ctx, hc, base, sample)
}
