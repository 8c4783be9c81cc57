package ipam

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/carve-net/carve/api"
)

// TestUnsolicitedGrantIsNotAdopted (issue 26, item 1): a host writes, with
// its own claim key, a ring grant of part of its lease to c, which never
// asked for space. c's ring shows the grant (it is b's signed word), but c
// allocates only in space the masters' records give it, or in a grant it
// asked for with the donor's statement in hand: it adopts no block there,
// counts the refusal, and an ADD never lands in it. Before, c adopted the
// block (origin grant, no statement, so the masters never heard of it) and
// placed containers there; when b returned the block and the masters
// leased it to another host, that host handed out the same addresses.
func TestUnsolicitedGrantIsNotAdopted(t *testing.T) {
	c := newCluster(t, 31, GrowthConfig{IdleReturn: -1})
	for _, id := range []string{"a", "b", "c"} {
		c.start(id, t.TempDir(), "")
	}
	c.gossipRounds()
	b, recipient := c.nodes["b"].svc.view.Self.Version, c.nodes["c"]
	granted := netip.MustParsePrefix("10.128.0.64/28")
	before := claimsRefused(t, recipient, unsolicitedGrant)
	if _, err := recipient.svc.gossip.Receive("", forgedClaims(t, "b", b, claimKeyOf("b"))); err != nil {
		t.Fatal(err)
	}
	recipient.svc.mu.Lock()
	o := recipient.svc.overlays["carve"]
	owner, _ := o.Alloc[0].Ring().Owner(granted.Addr())
	held := o.Held(0, granted)
	recipient.svc.mu.Unlock()
	if owner != "c" {
		t.Fatalf("the ring gives %s to %q, want c (b's own signed word counts in the ring)", granted, owner)
	}
	if held != nil {
		t.Errorf("c adopted %s (origin %s) from a grant it never asked for", held.Prefix, held.Origin)
	}
	if got := claimsRefused(t, recipient, unsolicitedGrant); got <= before {
		t.Errorf("refusals{reason=%q} = %v, want more than %v", unsolicitedGrant, got, before)
	}
	for i := range 40 {
		a, err := recipient.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprintf("ctr-%d", i), IfName: "eth0", Bridge: api.BridgeMesos})
		if err != nil {
			break // the bridge is full: what it had was never the grant
		}
		for _, ip := range a.IPs {
			if p, err := netip.ParsePrefix(ip.Address); err == nil && granted.Contains(p.Addr()) {
				t.Fatalf("an ADD on c got %s, inside the unsolicited grant %s", ip.Address, granted)
			}
		}
	}
}
