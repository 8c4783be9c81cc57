package ipam

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
)

// allocOn allocates on a bridge of nd, failing the test on an error.
func (nd *node) allocOn(t *testing.T, cid, bridge string) {
	t.Helper()
	if _, err := nd.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0", Bridge: bridge}); err != nil {
		t.Fatalf("%s: allocate %s on %s: %v", nd.id, cid, bridge, err)
	}
}

// nearlyFullPeers starts a, b and c with b and c holding all but 3 of
// their addresses (too few to spare a block: a donor keeps as much as it
// gives) and a's mesos bridge full.
func nearlyFullPeers(t *testing.T, seed uint64) *cluster {
	t.Helper()
	c := newCluster(t, seed, GrowthConfig{IdleReturn: -1, LowWater: -1})
	for _, id := range []string{"a", "b", "c"} {
		c.start(id, t.TempDir(), "")
	}
	for _, id := range []string{"b", "c"} {
		for i := range 26 {
			c.nodes[id].allocOn(t, fmt.Sprint(id, "m", i), api.BridgeMesos)
		}
		for i := range 29 {
			c.nodes[id].allocOn(t, fmt.Sprint(id, "d", i), api.BridgeDocker)
		}
	}
	for i := range 29 {
		c.nodes["a"].allocOn(t, fmt.Sprint("c", i), api.BridgeMesos)
	}
	c.gossipRounds() // every ring carries everyone's free counts
	return c
}

// TestFullOnlyWhenTheOverlayIsFull (issue 27, item 7: "overlay X is full"
// while peers had 15 free addresses): with the peers' addresses nearly all
// in use an ADD whose bridge is full fails as full, saying how many the
// peers hold and why none can be spared; once a peer frees 15 addresses
// the next ADD gets a block from it at once (before, the peers asked by
// the first growth were not asked again for a minute, and the ADD failed
// "overlay full: no peer has free space to ask for (2 refused recently)").
func TestFullOnlyWhenTheOverlayIsFull(t *testing.T) {
	c := nearlyFullPeers(t, 11)
	a, b := c.nodes["a"], c.nodes["b"]
	add := func(cid string) error {
		_, err := a.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: cid, IfName: "eth0", Bridge: api.BridgeMesos})
		return err
	}
	err := add("refused")
	if !api.IsCode(err, api.CodeExhausted) || !strings.Contains(err.Error(), `overlay "carve" is full`) ||
		!strings.Contains(err.Error(), "enough free addresses to spare a block") || !strings.Contains(err.Error(), "14 in all") {
		t.Fatalf("an ADD while the peers keep their last addresses: %v; want exhausted, full, saying the peers' 14 free addresses cannot be spared", err)
	}
	for i := range 15 {
		if _, err := b.svc.Release(api.IPAMRequest{Network: "carve", ContainerID: fmt.Sprint("bm", i), IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	c.gossipRounds() // a's ring learns b's new free count
	if err := add("after-b-freed-15"); err != nil {
		t.Fatalf("an ADD after peer b freed 15 addresses: %v", err)
	}
	c.gossipRounds()
	c.checkNoDoubles()
}

// TestOverlayFullSaysWhy: with every address of the overlay in use (the
// masters have no block, no peer reports a free address), the ADD fails
// as full, saying so and what to do, and counts an exhausted ADD.
func TestOverlayFullSaysWhy(t *testing.T) {
	c := newCluster(t, 12, GrowthConfig{IdleReturn: -1, LowWater: -1})
	for _, id := range []string{"a", "b", "c"} {
		c.start(id, t.TempDir(), "")
	}
	for _, id := range []string{"b", "c"} {
		for i := range 29 {
			c.nodes[id].allocOn(t, fmt.Sprint(id, "m", i), api.BridgeMesos)
			c.nodes[id].allocOn(t, fmt.Sprint(id, "d", i), api.BridgeDocker)
		}
	}
	a := c.nodes["a"]
	for i := range 29 {
		a.allocOn(t, fmt.Sprint("c", i), api.BridgeMesos)
	}
	c.gossipRounds()
	_, err := a.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: "more", IfName: "eth0", Bridge: api.BridgeMesos})
	if !api.IsCode(err, api.CodeExhausted) || !strings.Contains(err.Error(), `overlay "carve" is full`) ||
		!strings.Contains(err.Error(), "no peer reports enough free addresses") || !strings.Contains(err.Error(), "add an overlay with a new subnet") {
		t.Fatalf("the ADD in a full overlay: %v; want exhausted, the overlay full, why, and the fix", err)
	}
	if got := counterValue(t, a.reg, "carve_agent_ipam_exhausted_total"); got != 1 {
		t.Errorf("exhausted_total %v", got)
	}
}

// silentPeer is a TEST DOUBLE of a peer on the ring channel that takes
// every message and answers none (a donor cut off on the way back, or
// hung).
type silentPeer struct{}

func (silentPeer) Gossip() gossip.Data                             { return nil }
func (silentPeer) OnGossip([]byte) (gossip.Data, error)            { return nil, nil }
func (silentPeer) OnBroadcast(string, []byte) (gossip.Data, error) { return nil, nil }
func (silentPeer) OnUnicast(string, []byte) error                  { return nil }

// silentDonor starts a and b with b's rings known to a, then replaces b
// by a peer that answers nothing.
func silentDonor(t *testing.T, seed uint64, growth GrowthConfig) *node {
	t.Helper()
	c := newCluster(t, seed, growth)
	for _, id := range []string{"a", "b"} {
		c.start(id, t.TempDir(), "")
	}
	c.gossipRounds() // a's ring holds b's free counts
	c.stop("b")
	r, err := c.net.Join("b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Channel(RingChannel, silentPeer{}); err != nil {
		t.Fatal(err)
	}
	a := c.nodes["a"]
	for i := range 29 {
		a.allocOn(t, fmt.Sprint("c", i), api.BridgeMesos)
	}
	return a
}

// TestNoAnswerIsNotFull: a peer that reports free space but does not
// answer makes an ADD fail saying the peer did not answer, not that the
// overlay is full; and an ADD whose Wait ends while the growth still
// asks says that no space came within Wait, not that the overlay is full.
func TestNoAnswerIsNotFull(t *testing.T) {
	for _, tt := range []struct {
		name   string
		growth GrowthConfig
		want   []string
	}{
		{"the donor does not answer", GrowthConfig{AnswerTimeout: 20 * time.Millisecond}, []string{"b did not answer", "no peer granted space within 10s"}},
		{"the wait ends first", GrowthConfig{Wait: 30 * time.Millisecond}, []string{"no space came within 30ms", "still growing"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.growth.IdleReturn, tt.growth.LowWater = -1, -1
			a := silentDonor(t, 13, tt.growth)
			_, err := a.svc.Allocate(api.IPAMRequest{Network: "carve", ContainerID: "more", IfName: "eth0", Bridge: api.BridgeMesos})
			if !api.IsCode(err, api.CodeExhausted) || strings.Contains(err.Error(), "is full") {
				t.Fatalf("the ADD: %v; want exhausted, not \"is full\"", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the ADD: %v; want it to say %q", err, w)
				}
			}
		})
	}
}
