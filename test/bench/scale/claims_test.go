package main

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// TestSignedClaimsAreAdmitted: the claims test/bench/scale hands the real agent
// are what a receiver admits: every one signed by its writer's claim key,
// in its writer's lease, none refused; and one claim per writer at least.
func TestSignedClaimsAreAdmitted(t *testing.T) {
	const n = 20
	universe := netip.MustParsePrefix("10.128.0.0/9")
	st := &api.State{ClusterID: "bench-test", Network: api.NetworkConfig{Overlays: []api.OverlayNetwork{{Name: "carve", Subnet: universe.String(), Prefix: 24}}}}
	var sets []ring.LeaseSet
	for i := range n {
		subnet := fmt.Sprintf("10.128.%d.0/24", i)
		st.Agents = append(st.Agents, api.AgentInfo{AgentID: synthetic(i, false, true).AgentID, Version: uint64(10 + i), Overlays: []api.AgentOverlay{{
			Info: api.OverlayNetwork{Name: "carve"}, Subnet: subnet, MesosBridge: &api.BridgeInfo{IP: fmt.Sprintf("10.128.%d.1/25", i)}}}})
		sets = append(sets, ring.LeaseSet{Owner: st.Agents[i].AgentID, Version: uint64(10 + i), Prefixes: []netip.Prefix{netip.MustParsePrefix(subnet)}})
	}
	st.Agents = append(st.Agents, api.AgentInfo{AgentID: "real-agent", Version: 99}) // not synthetic: no claims
	msg, writers, err := signedClaimsMessage(st)
	if err != nil || writers != n {
		t.Fatalf("signedClaimsMessage: %d writers, %v; want %d", writers, err, n)
	}
	var wire struct {
		ClusterID string `json:"cluster_id"`
		Rings     []struct {
			Family string `json:"family"`
			Ring   []byte `json:"ring"`
		} `json:"rings"`
	}
	if err := json.Unmarshal(msg, &wire); err != nil || wire.ClusterID != st.ClusterID || len(wire.Rings) != 1 || wire.Rings[0].Family != "4" {
		t.Fatalf("message %+v: %v", wire, err)
	}
	remote, err := ring.Decode(wire.Rings[0].Ring)
	if err != nil {
		t.Fatal(err)
	}
	local, err := ring.NewRing(universe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := local.SeedSets(sets, nil); err != nil {
		t.Fatal(err)
	}
	signers := map[string]int{}
	_, refused := local.Admit(remote, func(c ring.Claim) (string, bool) {
		i, err := strconv.Atoi(strings.TrimPrefix(c.Signer, syntheticPrefix))
		if err != nil || !ed25519.Verify(claimKeyOf(i).Public().(ed25519.PublicKey), c.Msg, c.Sig) {
			return "bad_signature", false
		}
		signers[c.Signer]++
		return "", true
	})
	if len(refused) > 0 {
		t.Fatalf("%d claims refused, the first %+v", len(refused), refused[0])
	}
	if len(signers) != n {
		t.Errorf("claims of %d writers admitted, want %d", len(signers), n)
	}
}
