package state

import (
	"fmt"

	"github.com/carve-net/carve/api"
)

// The agents' keys, indexed.
//
// A registration is refused when another agent's record holds its
// WireGuard or claim key (keysFree). Every agent of this release registers
// a claim key, so the check runs for every registration: it scanned every
// record in sorted order, which at 50,000 agents cost each replica
// milliseconds a registration and made registering 50,000 agents
// quadratic. byKey names, for each key, the agents that registered it;
// keysFree checks that each still holds it, so an entry left behind
// cannot refuse anyone.

// keySet is the agents that registered one key.
type keySet map[string]struct{}

// indexKeys adds id's keys to byKey; the caller holds t.mu for writing.
func (t *LeaseTable) indexKeys(id string, keys api.AgentKeys) {
	for _, k := range []string{keys.WireGuard, keys.Claim} {
		if k == "" {
			continue
		}
		if t.byKey[k] == nil {
			t.byKey[k] = keySet{}
		}
		t.byKey[k][id] = struct{}{}
	}
}

// unindexKeys takes id out of its keys' entries; the caller holds t.mu
// for writing.
func (t *LeaseTable) unindexKeys(id string, keys api.AgentKeys) {
	for _, k := range []string{keys.WireGuard, keys.Claim} {
		if set := t.byKey[k]; set != nil {
			delete(set, id)
			if len(set) == 0 {
				delete(t.byKey, k)
			}
		}
	}
}

// keyHolder is the first agent by id, other than id, whose record holds
// key as its WireGuard key (wireGuard) or its claim key ("": none).
func (t *LeaseTable) keyHolder(id, key string, wireGuard bool) string {
	holder := ""
	if key == "" {
		return holder
	}
	for other := range t.byKey[key] {
		rec := t.agents[other]
		if other == id || rec == nil {
			continue
		}
		held := rec.Keys.Claim
		if wireGuard {
			held = rec.Keys.WireGuard
		}
		if held == key && (holder == "" || other < holder) {
			holder = other
		}
	}
	return holder
}

// keysFree refuses keys another agent's record holds: a WireGuard key
// names the peer every host encrypts to (a copy would take the victim's
// traffic, or drop its peer), a claim key the writer of ring claims. Checked
// in the log, so every replica refuses the same registration; where two
// agents hold them, the first by id is named (its WireGuard key before
// its claim key).
func (t *LeaseTable) keysFree(id string, keys api.AgentKeys) error {
	wg, claim := t.keyHolder(id, keys.WireGuard, true), t.keyHolder(id, keys.Claim, false)
	if wg != "" && (claim == "" || wg <= claim) {
		return fmt.Errorf("%w: the WireGuard public key %s is agent %s's; every agent registers its own key (wireguard.key in its data directory, made at its first start: remove a copied one and restart the agent)", ErrKeyInUse, keys.WireGuard, wg)
	}
	if claim != "" {
		return fmt.Errorf("%w: the claim key %s is agent %s's; every agent registers its own key (claim.key in its data directory, made at its first start: remove a copied one and restart the agent)", ErrKeyInUse, keys.Claim, claim)
	}
	return nil
}

// checkKeyIndex says which agent's key byKey misses; the caller holds t.mu.
func (t *LeaseTable) checkKeyIndex() error {
	for id, rec := range t.agents {
		for _, k := range []string{rec.Keys.WireGuard, rec.Keys.Claim} {
			if _, ok := t.byKey[k][id]; k != "" && !ok {
				return fmt.Errorf("agent %s's key %s is not in the key index", id, k)
			}
		}
	}
	return nil
}
