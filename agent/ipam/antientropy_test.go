package ipam

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
	"github.com/carve-net/carve/test/lab/fakegossip"
)

// otherSelf is the agent "other" of testView, as its own record.
func otherSelf() *api.AgentInfo {
	a := testSelf()
	a.AgentID, a.Version = "other", 4
	ov := &a.Overlays[0]
	ov.Subnet, ov.Subnet6 = "10.128.4.0/23", "fd00:0:0:2::/64"
	ov.MesosBridge = &api.BridgeInfo{Name: "m-carve", IP: "10.128.4.0/24", IP6: "fd00:0:0:2::/65"}
	ov.DockerBridge = &api.BridgeInfo{Name: "d-carve", IP: "10.128.5.0/24"}
	return a
}

// sentBytes counts what a service sends, by kind.
type sentBytes struct {
	mu     sync.Mutex
	byKind map[string]int
	count  map[string]int
}

func (s *sentBytes) add(kind string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byKind[kind] += n
	s.count[kind]++
}

func (s *sentBytes) reset() (bytes, count map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	bytes, count = s.byKind, s.count
	s.byKind, s.count = map[string]int{}, map[string]int{}
	return bytes, count
}

// TestRingAntiEntropy: two agents whose rings differ (each knows only its
// own free counts, and no broadcast went out) converge through digests and
// pushes alone; once they agree, a round sends digests only, a few dozen
// bytes per ring, never a ring.
func TestRingAntiEntropy(t *testing.T) {
	gnet, svcs, sent := ringGossipPair(t, 5, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	round := func() {
		gnet.GossipRound()
		if err := gnet.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
	}
	equal := func() bool {
		a, b := svcs["self"].Rings(), svcs["other"].Rings()
		return len(a) == 2 && slices.Equal(slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b))) &&
			bytes.Equal(a["carve/4"], b["carve/4"]) && bytes.Equal(a["carve/6"], b["carve/6"])
	}
	// An allocation changes self's free counts, written into its ring
	// and not announced (a broadcast lost).
	if _, err := svcs["self"].Allocate(api.IPAMRequest{Network: "carve", ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range sent {
		s.reset()
	}
	for _, svc := range svcs {
		writeFreeCounts(svc)
	}
	if equal() {
		t.Fatal("the rings agree before any gossip: the test proves nothing")
	}
	round()
	if !equal() {
		t.Fatalf("rings differ after one anti-entropy round (seed %d)", gnet.Seed())
	}
	for _, s := range sent {
		s.reset()
	}
	round()
	for id, s := range sent {
		b, n := s.reset()
		if b["push"] != 0 || b["delta"] != 0 {
			t.Errorf("%s sent rings between agreeing agents: %v", id, b)
		}
		if n["digest"] != 1 || b["digest"] > 200 {
			t.Errorf("%s: %d digests of %d bytes, want one of at most 200", id, n["digest"], b["digest"])
		}
	}

	// Anti-entropy repaired the lost broadcast by unicast: an agent's
	// next announcement still carries those entries (the other agents may
	// lack them). Announce them now, so that what follows measures the
	// lease alone (which of the two agents pushed first varies by run).
	for _, svc := range svcs {
		svc.gossip.Announce()
	}
	if err := gnet.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range sent {
		s.reset()
	}

	// A new agent's lease (a registration) changes every agent's ring
	// alike, from its own view: nothing is broadcast, and the rings agree.
	third := Peer{ID: "third", Version: 20, Subnets: []string{"10.128.8.0/23", "fd00:0:0:3::/64"}}
	for _, self := range []*api.AgentInfo{testSelf(), otherSelf()} {
		v := testView(testSelf())
		v.Self = self
		v.Peers = []Peer{peerOf(testSelf()), peerOf(otherSelf()), third}
		before := svcs[self.AgentID].Rings()["carve/4"]
		svcs[self.AgentID].Sync(v)
		if bytes.Equal(before, svcs[self.AgentID].Rings()["carve/4"]) {
			t.Fatalf("%s: the new lease did not change the ring", self.AgentID)
		}
	}
	if err := gnet.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	for id, s := range sent {
		if b, _ := s.reset(); b["delta"] != 0 {
			t.Errorf("%s broadcast %d bytes of rings for a lease every agent learns from the masters", id, b["delta"])
		}
	}
	if !equal() {
		t.Fatal("the rings differ after both agents synced the same leases")
	}
}

// TestRingGossipInProportionToChange: with 250 agents in the rings,
// an allocation is announced as a delta of a few tokens, and a change a
// broadcast missed is repaired by anti-entropy with the bucket hashes and
// the buckets that differ, never the whole ring; the rings end equal.
func TestRingGossipInProportionToChange(t *testing.T) {
	var peers []Peer
	for i := range 250 {
		peers = append(peers, Peer{ID: fmt.Sprintf("peer-%03d", i), Version: uint64(10 + i),
			Subnets: []string{fmt.Sprintf("10.128.%d.%d/26", 64+i/4, 64*(i%4))}})
	}
	gnet, svcs, sent := ringGossipPair(t, 9, peers)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	idle := func() {
		t.Helper()
		if err := gnet.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
	}
	equal := func() bool {
		a, b := svcs["self"].Rings(), svcs["other"].Rings()
		return bytes.Equal(a["carve/4"], b["carve/4"]) && bytes.Equal(a["carve/6"], b["carve/6"])
	}
	gnet.GossipRound()
	idle()
	if !equal() {
		t.Fatalf("rings differ after an anti-entropy round (seed %d)", gnet.Seed())
	}
	whole := len(svcs["self"].Rings()["carve/4"])
	if whole < 4000 {
		t.Fatalf("the ring is %d bytes: too small for the test to show anything", whole)
	}
	for _, s := range sent {
		s.reset()
	}

	// An allocation, announced: a delta of the tokens it wrote.
	if _, err := svcs["self"].Allocate(req("c1")); err != nil {
		t.Fatal(err)
	}
	svcs["self"].gossip.Announce()
	idle()
	b, n := sent["self"].reset()
	if n["delta"] != 1 || b["delta"] == 0 || b["delta"] > whole/16 {
		t.Errorf("an allocation announced in %d messages of %d bytes in all; the ring is %d bytes", n["delta"], b["delta"], whole)
	}
	if !equal() {
		t.Fatalf("rings differ after the delta (seed %d)", gnet.Seed())
	}
	svcs["self"].gossip.Announce()
	if b, _ := sent["self"].reset(); b["delta"] != 0 {
		t.Errorf("announced %d bytes with nothing new", b["delta"])
	}

	// An allocation nobody announced: anti-entropy sends the buckets that
	// differ, a fraction of the ring.
	if _, err := svcs["self"].Allocate(req("c2")); err != nil {
		t.Fatal(err)
	}
	for _, s := range sent {
		s.reset()
	}
	writeFreeCounts(svcs["self"])
	gnet.GossipRound()
	idle()
	if !equal() {
		t.Fatalf("rings differ after anti-entropy (seed %d)", gnet.Seed())
	}
	total := 0
	for id, s := range sent {
		b, n := s.reset()
		t.Logf("%s sent %v bytes in %v messages; the ring is %d bytes", id, b, n, whole)
		total += b["buckets"] + b["push"]
		if n["push"] > 0 && b["push"]/n["push"] > whole/4 {
			t.Errorf("%s pushed %d bytes in %d messages to repair one change of a %d-byte ring", id, b["push"], n["push"], whole)
		}
	}
	if total == 0 {
		t.Error("no bucket hashes or push: the rings were not repaired by anti-entropy")
	}
}

// TestRingAntiEntropyRoundReconciles: one round of the real handlers
// (one agent's digest, answered through the fake network) reconciles two
// rings of 1,000 agents in either direction, with a push of a fraction of
// the ring, and costs the digest alone between equal rings.
func TestRingAntiEntropyRoundReconciles(t *testing.T) {
	var peers []Peer
	for i := range 1000 {
		peers = append(peers, Peer{ID: fmt.Sprintf("agent-%03d", i), Version: uint64(10 + i),
			Subnets: []string{fmt.Sprintf("10.%d.%d.0/24", 129+i/256, i%256)}})
	}
	for _, tt := range []struct{ name, ahead, sender string }{
		{"digest sender ahead", "self", "self"},
		{"digest sender behind", "self", "other"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gnet, svcs, sent := ringGossipPair(t, 12, peers)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			equal := func() bool {
				a, b := svcs["self"].Rings(), svcs["other"].Rings()
				return bytes.Equal(a["carve/4"], b["carve/4"]) && bytes.Equal(a["carve/6"], b["carve/6"])
			}
			// One round: the sender's digest alone starts it.
			round := func() {
				t.Helper()
				svc := svcs[tt.sender]
				svc.mu.Lock()
				ch := svc.channel
				svc.mu.Unlock()
				ch.Gossip(svc.RingGossip().Gossip())
				if err := gnet.WaitIdle(ctx); err != nil {
					t.Fatal(err)
				}
			}
			gnet.GossipRound() // what each agent wrote of its own at the sync
			if err := gnet.WaitIdle(ctx); err != nil {
				t.Fatal(err)
			}
			if !equal() {
				t.Fatalf("the rings differ before the change (seed %d)", gnet.Seed())
			}
			whole := len(svcs["self"].Rings()["carve/4"])
			if _, err := svcs[tt.ahead].Allocate(req("c1")); err != nil {
				t.Fatal(err)
			}
			writeFreeCounts(svcs[tt.ahead])
			if equal() {
				t.Fatal("the rings agree after an unannounced allocation: the test proves nothing")
			}
			for _, s := range sent {
				s.reset()
			}
			round()
			if !equal() {
				t.Fatalf("not reconciled after a round (seed %d)", gnet.Seed())
			}
			total, push := 0, 0
			for id, s := range sent {
				b, n := s.reset()
				t.Logf("%s sent %v bytes in %v messages; the ring is %d bytes", id, b, n, whole)
				total += b["digest"] + b["buckets"] + b["push"]
				push += b["push"]
			}
			if push == 0 || total > whole/4 {
				t.Errorf("round of %d bytes (push %d) for a %d-byte ring", total, push, whole)
			}
			round()
			for id, s := range sent {
				b, n := s.reset()
				if b["buckets"]+b["push"] != 0 || (id == tt.sender) != (n["digest"] == 1) {
					t.Errorf("round between equal rings: %s sent %v in %v; want the sender's digest alone", id, b, n)
				}
			}
		})
	}
}

// ringGossipPair is the agents "self" and "other" (with more peers in
// their views), synced before they join a fake gossip network (nothing is
// broadcast), and what each sends, by kind.
func ringGossipPair(t *testing.T, seed uint64, more []Peer) (*fakegossip.Network, map[string]*Service, map[string]*sentBytes) {
	t.Helper()
	gnet := fakegossip.New(fakegossip.Config{Seed: seed})
	t.Cleanup(gnet.Close)
	sent := map[string]*sentBytes{}
	svcs := map[string]*Service{}
	for _, self := range []*api.AgentInfo{testSelf(), otherSelf()} {
		id := self.AgentID
		sent[id] = &sentBytes{byKind: map[string]int{}, count: map[string]int{}}
		svc, err := New(Config{AgentID: id, DB: openDB(t, t.TempDir()), Logger: testLogger(), OnSent: sent[id].add})
		if err != nil {
			t.Fatal(err)
		}
		v := testView(testSelf())
		v.Self = self
		v.Peers = append([]Peer{peerOf(testSelf()), peerOf(otherSelf())}, more...)
		svc.Sync(v) // no channel yet: nothing is broadcast
		r, err := gnet.Join(id)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := r.Channel(RingChannel, svc.RingGossip())
		if err != nil {
			t.Fatal(err)
		}
		svc.UseChannel(ch)
		svcs[id] = svc
	}
	return gnet, svcs, sent
}

// writeFreeCounts writes a service's free counts into its rings without
// announcing them: a broadcast that was lost.
func writeFreeCounts(s *Service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.eachServedRing(true, func(ringID, *ring.Allocator) {})
}

// TestGrantAnswerIsWhatTheGrantWrote: a donor among 250 agents answers a
// space request with the ring entries the grant wrote, not its whole ring,
// and the recipient's ring then gives it the block.
func TestGrantAnswerIsWhatTheGrantWrote(t *testing.T) {
	var peers []Peer
	for i := range 250 {
		peers = append(peers, Peer{ID: fmt.Sprintf("peer-%03d", i), Version: uint64(10 + i),
			Subnets: []string{fmt.Sprintf("10.128.%d.%d/26", 64+i/4, 64*(i%4))}})
	}
	_, svcs, _ := ringGossipPair(t, 3, peers)
	donor, recipient := svcs["other"], svcs["self"]
	whole := len(donor.Rings()["carve/4"])
	req := ipamwire.SpaceMessage{V: ipamwire.SpaceVersion, Kind: ipamwire.KindRequest, ClusterID: "", From: "self", ID: "self-1", Overlay: "carve", Family: "4", Bits: 27}
	ans, b := donor.decideDonation(req)
	if ans.Kind != ipamwire.KindGrant {
		t.Fatalf("answered %s %q, want a grant", ans.Kind, ans.Reason)
	}
	if err := donor.commits.Flush(b); err != nil {
		t.Fatal(err)
	}
	if len(ans.Ring) > whole/8 {
		t.Errorf("the grant answer carries %d bytes of ring; the whole ring is %d", len(ans.Ring), whole)
	}
	if _, err := recipient.mergeRings(ipamwire.RingMessage{Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: ans.Ring}}}); err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix(ans.Prefix)
	recipient.mu.Lock()
	owner, _ := recipient.overlays["carve"].Alloc[0].Ring().Owner(p.Addr())
	recipient.mu.Unlock()
	if owner != "self" {
		t.Fatalf("after the answer, the recipient's ring gives %s to %q", p, owner)
	}
	// A repeated request (the recipient restarted) gets every claim of
	// the ring (never its leases: the recipient seeds those itself).
	again, _ := donor.decideDonation(req)
	donor.mu.Lock()
	claims := len(donor.overlays["carve"].Alloc[0].Ring().Claims().Encode())
	donor.mu.Unlock()
	if again.Kind != ipamwire.KindGrant || again.Prefix != ans.Prefix || len(again.Ring) != claims {
		t.Errorf("a repeated request: %s %s with %d bytes of ring; want the same grant with every claim (%d)", again.Kind, again.Prefix, len(again.Ring), claims)
	}
}

// TestGrantedRequestsForgotten: the donor remembers a granted request (a
// repeat gets the same block) until the masters' record of the recipient
// lists the block, or the recipient is deleted; then it forgets it, on
// disk too.
func TestGrantedRequestsForgotten(t *testing.T) {
	for _, tt := range []struct {
		name   string
		update func(v *View, block string)
	}{
		{"the recipient's record lists the block", func(v *View, block string) {
			for i := range v.Peers {
				if v.Peers[i].ID == "self" {
					v.Peers[i].Version += 10
					v.Peers[i].Subnets = append(v.Peers[i].Subnets, block)
				}
			}
		}},
		{"the recipient is deleted", func(v *View, _ string) {
			v.Tombstones = append(v.Tombstones, api.Tombstone{AgentID: "self", Version: 50})
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, svcs, _ := ringGossipPair(t, 4, nil)
			donor := svcs["other"]
			req := ipamwire.SpaceMessage{V: ipamwire.SpaceVersion, Kind: ipamwire.KindRequest, From: "self", ID: "self-1", Overlay: "carve", Family: "4", Bits: 27}
			ans, b := donor.decideDonation(req)
			if ans.Kind != ipamwire.KindGrant {
				t.Fatalf("answered %s %q, want a grant", ans.Kind, ans.Reason)
			}
			if err := donor.commits.Flush(b); err != nil {
				t.Fatal(err)
			}
			stored := func() int {
				n := 0
				_ = donor.db.View(func(tx *bolt.Tx) error {
					n = tx.Bucket([]byte(ipamstore.GrantedBucket)).Stats().KeyN
					return nil
				})
				return n
			}
			v := testView(testSelf())
			v.Self = otherSelf()
			v.Peers = []Peer{peerOf(testSelf()), peerOf(otherSelf())}
			donor.Sync(v) // the grant is not recorded yet: remembered
			if n := stored(); n != 1 || len(donor.grow.granted) != 1 {
				t.Fatalf("before the masters record the grant: %d stored, %d in memory; want 1", n, len(donor.grow.granted))
			}
			tt.update(&v, ans.Prefix)
			donor.Sync(v)
			if n := stored(); n != 0 || len(donor.grow.granted) != 0 {
				t.Errorf("%d stored, %d in memory; want the granted request forgotten", n, len(donor.grow.granted))
			}
		})
	}
}
