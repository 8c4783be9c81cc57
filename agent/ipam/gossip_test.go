package ipam

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/antientropy"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// fuzzService is a Service with allocations, for FuzzRingMessageHandler.
func fuzzService(f *testing.F) *Service {
	f.Helper()
	db, err := bolt.Open(f.TempDir()+"/agent.db", 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	// Attributed claims on: what the fuzzer sends goes through the
	// signature checks (other's key is in its record).
	s, err := New(Config{AgentID: "self", DB: db, Logger: testLogger(), ClaimKey: claimKeyOf("self")})
	if err != nil {
		f.Fatal(err)
	}
	v := testView(testSelf())
	v.ClusterID = "fuzz-cluster"
	for i := range v.Peers {
		v.Peers[i].ClaimKey = claimKeyOf(v.Peers[i].ID).Public().(ed25519.PublicKey)
	}
	s.Sync(v)
	for i := range 20 {
		if _, err := s.Allocate(req(fmt.Sprintf("c%d", i))); err != nil {
			f.Fatal(err)
		}
	}
	return s
}

// checkAllocations fails when an address is held twice or lies outside the
// ranges the ring gives this agent.
func checkAllocations(t *testing.T, s *Service) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.overlays {
		seen := map[netip.Addr]ring.Attachment{}
		for at, rec := range o.Attached {
			for fam := range families {
				addr := rec.Addr(fam)
				if !addr.IsValid() {
					continue
				}
				if other, dup := seen[addr]; dup {
					t.Fatalf("%s held by %v and %v", addr, other, at)
				}
				seen[addr] = at
				if owner, ok := o.Alloc[fam].Ring().Owner(addr); !ok || owner != s.id {
					t.Fatalf("%s of %v is owned by %q in the ring", addr, at, owner)
				}
				if holder, ok := o.Alloc[fam].Holder(addr); !ok || holder != at {
					t.Fatalf("%s of %v is held by %v in the allocator", addr, at, holder)
				}
			}
		}
	}
}

// FuzzRingMessageHandler: ring gossip from the network never panics the
// decoder nor the merge into a real allocator holding allocations; after
// any message no address is held twice or outside the agent's ranges, and
// a refused merge leaves the rings as they were.
func FuzzRingMessageHandler(f *testing.F) {
	f.Add([]byte(`{"rings":[{"overlay":"carve","family":"4","ring":"AAEC"}]}`))
	f.Add([]byte(`{"rings":[{"overlay":"carve","family":"5","ring":""}]}`))
	f.Add([]byte(`{}`))
	s := fuzzService(f)
	// Real rings: the agent's own, one that takes its range away, and
	// one of another cluster.
	own, _ := json.Marshal(s.rings())
	f.Add(own)
	thief, err := ring.NewAllocator("other", netip.MustParsePrefix("10.128.0.0/16"))
	if err != nil {
		f.Fatal(err)
	}
	if _, err := thief.Seed([]ring.Lease{{Owner: "other", Prefix: netip.MustParsePrefix("10.128.2.0/23"), Version: 100}}, []ring.Tombstone{{Owner: "self", Version: 50}}); err != nil {
		f.Fatal(err)
	}
	takeover, _ := json.Marshal(ipamwire.RingMessage{ClusterID: "fuzz-cluster", Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: thief.EncodeRing()}}})
	f.Add(takeover)
	otherCluster, _ := json.Marshal(ipamwire.RingMessage{ClusterID: "another", Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: thief.EncodeRing()}}})
	f.Add(otherCluster)
	// Anti-entropy: digests (answered by a unicast push), and a push
	// through the unicast path.
	f.Add([]byte(`{"cluster_id":"fuzz-cluster","from":"peer","digest":[{"overlay":"carve","family":"4","hash":1}]}`))
	f.Add([]byte(`{"from":"","digest":[{"overlay":"carve","family":"7","hash":1}]}`))
	f.Add([]byte(`{"from":"peer","digest":[]}`))
	// Bucket hashes (answered by a push of the differing buckets) and a
	// push of named buckets (merged, answered by a push back).
	f.Add([]byte(`{"cluster_id":"fuzz-cluster","buckets":[{"overlay":"carve","family":"4","hashes":"AAAAAAAAAAEAAAAAAAAAAg=="}]}`))
	if in, err := antientropy.Selector(2, []int{1}); err == nil {
		part := thief.Ring().Select(in)
		push, _ := json.Marshal(ipamwire.RingMessage{ClusterID: "fuzz-cluster", Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: part.Encode(), N: 2, Buckets: []int{1}}}})
		f.Add(push)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ipamwire.DecodeRingMessage(data)
		if err != nil {
			return
		}
		for _, e := range m.Rings {
			before := s.Rings()
			_, err := s.mergeRings(ipamwire.RingMessage{ClusterID: m.ClusterID, Rings: []ipamwire.RingEntry{e}})
			if err != nil && !maps.EqualFunc(before, s.Rings(), bytes.Equal) {
				t.Fatalf("a refused merge (%v) changed the rings", err)
			}
			checkAllocations(t, s)
		}
		// The whole message through the handler, as the router delivers it.
		_, _ = s.RingGossip().OnGossip(data)
		checkAllocations(t, s)
		_ = s.RingGossip().OnUnicast("peer", data)
		checkAllocations(t, s)
		if _, err := s.Allocate(api.IPAMRequest{Network: "carve", ContainerID: "after", IfName: "eth0"}); err == nil {
			_, _ = s.Release(api.IPAMRequest{Network: "carve", ContainerID: "after", IfName: "eth0"})
		}
		checkAllocations(t, s)
	})
}

// TestOtherAgentsEntriesPersistedLater: a merge that brings only other
// agents' entries (a free count) is not written at once, which would cost
// every agent a whole ring on disk per change anywhere; Run's periodic
// write persists it. A merge that moves what this agent owns is written in
// the merge's own commit.
func TestOtherAgentsEntriesPersistedLater(t *testing.T) {
	s, err := New(Config{AgentID: "self", DB: openDB(t, t.TempDir()), Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	v := testView(testSelf())
	s.Sync(v)
	saved := func() []byte {
		b, err := ringStore{s.db, s.dbPath}.SavedRing("carve", 0)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	mine := func() []byte { return s.Rings()["carve/4"] }
	other, err := ring.NewAllocator("other", netip.MustParsePrefix("10.128.0.0/16"))
	if err != nil {
		t.Fatal(err)
	}
	var sets []ring.LeaseSet
	for _, p := range v.Peers {
		sets = append(sets, ring.LeaseSet{Owner: p.ID, Version: p.Version, Prefixes: []netip.Prefix{netip.MustParsePrefix(p.Subnets[0])}})
	}
	if _, err := other.SeedSets(sets, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Allocate(ring.Attachment{ContainerID: "c", Interface: "eth0"}, netip.MustParsePrefix("10.128.4.0/24")); err != nil {
		t.Fatal(err)
	}
	if _, err := other.SyncFree(); err != nil {
		t.Fatal(err)
	}
	before := saved()
	news, err := s.mergeRings(ipamwire.RingMessage{Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: other.EncodeRing()}}})
	if err != nil || len(news.Rings) != 1 {
		t.Fatalf("merge: %v, %d rings of news", err, len(news.Rings))
	}
	if !bytes.Equal(saved(), before) {
		t.Error("another agent's free count was written to disk at once")
	}
	s.persistDirtyRings()
	if !bytes.Equal(saved(), mine()) {
		t.Error("the periodic write did not persist the merged ring")
	}

	// The other agent grants this one a block: written with the merge.
	if err := other.Grant("self", netip.MustParsePrefix("10.128.5.0/26")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.mergeRings(ipamwire.RingMessage{Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: other.EncodeRing()}}}); err != nil {
		t.Fatal(err)
	}
	if owner, _ := other.Ring().Owner(netip.MustParseAddr("10.128.5.1")); owner != "self" {
		t.Fatalf("the grant did not give the block: owner %q", owner)
	}
	onDisk, err := ring.Decode(saved())
	if err != nil {
		t.Fatal(err)
	}
	if owner, _ := onDisk.Owner(netip.MustParseAddr("10.128.5.1")); owner != "self" {
		t.Errorf("a merge that gave this agent a block was not written with the merge: on disk the block is %q's", owner)
	}
}

// TestGossipHandlersRaceSync: the ring channel's handlers run on the
// mesh's goroutines while the agent syncs, and a sync may change the
// cluster id (the first one learnt, a rebuilt cluster): every handler
// reads the Service's state under its lock (go test -race).
func TestGossipHandlersRaceSync(t *testing.T) {
	svc, err := New(Config{AgentID: "self", DB: openDB(t, t.TempDir()), Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	h := svc.RingGossip()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if d := h.Gossip(); d != nil {
				for _, b := range d.Encode() {
					_, _ = h.OnGossip(b)
				}
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	for i := range 20 {
		v := testView(testSelf())
		v.ClusterID = fmt.Sprint("cluster-", i/2) // new every other sync
		svc.Sync(v)
	}
}
