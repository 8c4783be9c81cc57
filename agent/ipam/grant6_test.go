package ipam

import (
	"errors"
	"testing"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
)

// TestNoIPv6GrantThroughRing: a donor grants only from its bridges' first
// blocks, and those are on-link for its own containers. For IPv4 the
// bridge answers ARP for the granted part (proxy_arp, vxlan); IPv6 would
// need a proxy NDP entry per address, so a donor refuses to grant IPv6
// space (its containers could not reach the recipient's) and an agent does
// not ask for it: IPv6 grows at the masters only. The IPv4 request of the
// same peer is granted, so the refusal is about the family.
func TestNoIPv6GrantThroughRing(t *testing.T) {
	c := newCluster(t, 1, GrowthConfig{IdleReturn: -1})
	for _, id := range []string{"a", "b"} {
		c.start(id, t.TempDir(), "")
	}
	c.gossipRounds()
	b := c.nodes["b"]
	req := func(family string, bits int) ipamwire.SpaceMessage {
		return ipamwire.SpaceMessage{V: ipamwire.SpaceVersion, Kind: ipamwire.KindRequest, ClusterID: "c1", From: "a", ID: "a-" + family,
			Overlay: "carve", Family: family, Bits: bits}
	}
	ans, _ := b.svc.decideDonation(req("6", 65))
	if ans.Kind != ipamwire.KindRefuse || ans.Reason != ipamwire.ReasonIPv6NotGranted {
		t.Errorf("IPv6 space request answered %s %q %s, want a refusal %q", ans.Kind, ans.Reason, ans.Prefix, ipamwire.ReasonIPv6NotGranted)
	}
	ans, bt := b.svc.decideDonation(req("4", 27))
	if ans.Kind != ipamwire.KindGrant {
		t.Fatalf("IPv4 space request answered %s %q, want a grant", ans.Kind, ans.Reason)
	}
	if err := b.svc.commits.Flush(bt); err != nil {
		t.Fatal(err)
	}
	// The asking side does not ask for IPv6 at all.
	err := c.nodes["a"].svc.asker.Ask(t.Context(), "carve", "mesos", 1, nil)
	if err == nil || !errors.Is(err, errOverlayFull) {
		t.Errorf("growing IPv6 through the ring: %v, want errOverlayFull", err)
	}
}
