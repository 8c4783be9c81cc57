package state

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

func testKey(seed byte) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{seed}, 32)) }

// An agent's keys and underlay MTU (record format v3) are stored as
// registered, rendered into its record, survive a snapshot, and a change of
// either is a new record version.
func TestRegisteredKeysAndMTU(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	keys := api.AgentKeys{Claim: testKey(1), WireGuard: testKey(2)}
	reg := func(k api.AgentKeys, mtu int) *api.AgentInfo {
		t.Helper()
		res := h.apply(command{Op: opRegister, Register: &registerCmd{AgentID: "a1", IP: "198.18.0.11", Keys: k, UnderlayMTU: mtu,
			Bridges: api.AgentNetworkConfig{MesosBridge: true}}})
		if res.Err != nil {
			t.Fatalf("register: %v", res.Err)
		}
		return res.Agent
	}
	first := reg(keys, 9000)
	if first.Keys != keys || first.UnderlayMTU != 9000 {
		t.Fatalf("record keys %+v mtu %d, want %+v 9000", first.Keys, first.UnderlayMTU, keys)
	}
	if _, changes := h.table.WouldChange(api.RegisterRequest{AgentID: "a1", IP: "198.18.0.11", Keys: keys, UnderlayMTU: 9000,
		NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}}); changes {
		t.Error("an unchanged registration with keys would change the record")
	}
	restored := restoreCopy(t, h)
	if got, _ := restored.Agent("a1"); got == nil || got.Keys != keys || got.UnderlayMTU != 9000 {
		t.Errorf("after a snapshot: %+v", got)
	}
	rotated := reg(api.AgentKeys{Claim: testKey(1), WireGuard: testKey(3)}, 9000)
	if rotated.Version <= first.Version || rotated.Keys.WireGuard != testKey(3) {
		t.Errorf("a new WireGuard key: version %d (was %d), keys %+v", rotated.Version, first.Version, rotated.Keys)
	}
	if smaller := reg(rotated.Keys, 1500); smaller.Version <= rotated.Version || smaller.UnderlayMTU != 1500 {
		t.Errorf("a new MTU: version %d (was %d), mtu %d", smaller.Version, rotated.Version, smaller.UnderlayMTU)
	}
	if overlaySubnet(t, rotated, "carve") != overlaySubnet(t, first, "carve") {
		t.Error("a key change moved the leases")
	}
}

func TestRegistrationKeysValidated(t *testing.T) {
	for _, tt := range []struct {
		name string
		req  api.RegisterRequest
		want string
	}{
		{"bad claim key", api.RegisterRequest{Keys: api.AgentKeys{Claim: "abc"}}, "keys.claim"},
		{"short wireguard key", api.RegisterRequest{Keys: api.AgentKeys{WireGuard: base64.StdEncoding.EncodeToString([]byte("x"))}}, "keys.wireguard"},
		{"mtu too small", api.RegisterRequest{UnderlayMTU: 100}, "underlay_mtu"},
	} {
		tt.req.AgentID, tt.req.IP = "a1", "198.18.0.1"
		if _, err := RegisterCommand(tt.req); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error naming %s", tt.name, err, tt.want)
		}
	}
}
