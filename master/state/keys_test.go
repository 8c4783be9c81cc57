package state

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
)

func testKey(seed byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{seed}, 32))
}

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
		if _, err := logcmd.RegisterCommand(tt.req); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error naming %s", tt.name, err, tt.want)
		}
	}
}

// TestKeysAreTheirHolders (issue 26, item 5): a registration carrying
// another agent's WireGuard or claim key is refused in the log (every
// replica refuses it), naming the holder, and changes nothing; the holder
// re-registering its own key, or a deleted holder's key taken by a new
// agent, is accepted.
func TestKeysAreTheirHolders(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	reg := func(id, ip string, k api.AgentKeys) Result {
		t.Helper()
		return h.apply(command{Op: opRegister, Register: &registerCmd{AgentID: id, IP: ip, Keys: k, Bridges: api.AgentNetworkConfig{MesosBridge: true}}})
	}
	victim := api.AgentKeys{Claim: testKey(1), WireGuard: testKey(2)}
	if res := reg("victim", "198.18.0.1", victim); res.Err != nil {
		t.Fatal(res.Err)
	}
	_, before := h.table.StateDigest()
	for name, k := range map[string]api.AgentKeys{
		"its WireGuard key": {Claim: testKey(3), WireGuard: victim.WireGuard},
		"its claim key":     {Claim: victim.Claim, WireGuard: testKey(4)},
	} {
		res := reg("attacker", "198.18.0.2", k)
		if !errors.Is(res.Err, ErrKeyInUse) || !strings.Contains(res.Err.Error(), "victim") {
			t.Errorf("a registration with %s: %v, want ErrKeyInUse naming victim", name, res.Err)
		}
	}
	if _, after := h.table.StateDigest(); after != before {
		t.Error("a refused registration changed the state")
	}
	if res := reg("victim", "198.18.0.1", victim); res.Err != nil {
		t.Errorf("the holder registering its own keys again: %v", res.Err)
	}
	h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{"victim"}}})
	if res := reg("heir", "198.18.0.3", victim); res.Err != nil {
		t.Errorf("a deleted agent's keys are free again: %v", res.Err)
	}
}

// keysFreeByScan is keysFree as it was before the key index: every record
// in order of id, its WireGuard key before its claim key. The property
// test holds the index to it.
func keysFreeByScan(tb *LeaseTable, id string, keys api.AgentKeys) string {
	for _, other := range slices.Sorted(maps.Keys(tb.agents)) {
		if other == id {
			continue
		}
		k := tb.agents[other].Keys
		if keys.WireGuard != "" && k.WireGuard == keys.WireGuard {
			return "wireguard " + other
		}
		if keys.Claim != "" && k.Claim == keys.Claim {
			return "claim " + other
		}
	}
	return ""
}

// TestKeyIndexAgreesWithTheScan: through random registrations (keys drawn
// from a small pool, so that agents take each other's, change keys and
// drop them), deletions and snapshot round trips, keysFree through the
// key index refuses exactly what the scan of every record refused, naming
// the same agent, and the index lists every agent's keys.
func TestKeyIndexAgreesWithTheScan(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	h := newHarness(t, DefaultConfig())
	key := func() string {
		if rng.IntN(4) == 0 {
			return ""
		}
		return testKey(byte(1 + rng.IntN(12)))
	}
	refused, accepted := 0, 0
	for step := range 2000 {
		id := fmt.Sprintf("a%02d", rng.IntN(16))
		switch r := rng.IntN(20); {
		case r < 15:
			keys := api.AgentKeys{WireGuard: key(), Claim: key()}
			want := ""
			if old := h.table.agents[id]; old == nil || old.Keys != keys {
				want = keysFreeByScan(h.table, id, keys)
			}
			res := h.apply(command{Op: opRegister, Register: &registerCmd{AgentID: id, IP: fmt.Sprintf("198.18.1.%d", 1+rng.IntN(200)), Keys: keys,
				Bridges: api.AgentNetworkConfig{MesosBridge: true}}})
			switch {
			case want == "" && res.Err != nil:
				t.Fatalf("step %d: %s with %+v refused (%v), the scan found no holder", step, id, keys, res.Err)
			case want != "" && (!errors.Is(res.Err, ErrKeyInUse) || !strings.Contains(res.Err.Error(), keyKind(want)) || !strings.Contains(res.Err.Error(), "agent "+strings.Fields(want)[1]+"'s")):
				t.Fatalf("step %d: %s with %+v: %v, the scan found %s", step, id, keys, res.Err, want)
			case want != "":
				refused++
			default:
				accepted++
			}
		case r < 18:
			h.apply(command{Op: opDelete, Delete: &deleteCmd{Agents: []string{id}}})
		default:
			var buf bytes.Buffer
			if err := h.table.WriteSnapshot(&buf); err != nil {
				t.Fatal(err)
			}
			if err := h.table.Restore(h.index, &buf); err != nil {
				t.Fatalf("step %d: restore: %v", step, err)
			}
		}
		checkTable(t, h.table)
	}
	if refused < 100 || accepted < 100 {
		t.Fatalf("%d registrations refused and %d accepted: the pool of keys does not exercise both", refused, accepted)
	}
}

// keyKind is how keysFree's error names the kind of key the scan found.
func keyKind(found string) string {
	if strings.HasPrefix(found, "wireguard") {
		return "WireGuard public key"
	}
	return "claim key"
}
