package ringgossip

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/ring"
)

// ringVersions returns n encodings of one overlay family's ring as peers
// hold it over time: leases of /24s to a few agents at rising Raft indexes
// (a subnet re-leased to another agent), free counts reported on the way.
func ringVersions(t *testing.T, rng *rand.Rand, universe netip.Prefix, n int) [][]byte {
	t.Helper()
	owners := []string{"a", "b", "c", "d"}
	var leases []ring.Lease
	var out [][]byte
	for v := uint64(1); len(out) < n; v++ {
		p := netip.PrefixFrom(universe.Addr(), 24)
		for range rng.IntN(16) {
			p = netip.PrefixFrom(nextPrefix(p), 24)
		}
		leases = append(leases, ring.Lease{Owner: owners[rng.IntN(len(owners))], Prefix: p, Version: v})
		// A peer's view: a random part of the table so far.
		self := owners[rng.IntN(len(owners))]
		a, err := ring.NewAllocator(self, universe)
		if err != nil {
			t.Fatal(err)
		}
		var part []ring.Lease
		for _, l := range leases {
			if rng.IntN(2) == 0 {
				part = append(part, l)
			}
		}
		if _, err := a.Seed(part, nil); err != nil {
			t.Fatal(err)
		}
		for _, r := range a.Owned() {
			if rng.IntN(2) == 0 {
				_, _ = a.Allocate(ring.Attachment{ContainerID: fmt.Sprint("c", v), Interface: "eth0"}, netip.PrefixFrom(r.First, 24))
			}
		}
		if _, err := a.SyncFree(); err != nil {
			t.Fatal(err)
		}
		out = append(out, a.EncodeRing())
	}
	return out
}

func nextPrefix(p netip.Prefix) netip.Addr {
	a := p.Addr()
	for range 256 {
		a = a.Next()
	}
	return a
}

// TestRingDataMergeIsAJoin (bug 7): coalescing many versions of the same
// rings keeps one ring per (overlay, family), equal to the ring CRDT's merge
// of all of them, whatever the order.
func TestRingDataMergeIsAJoin(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		keys := []struct {
			overlay, family string
			universe        netip.Prefix
		}{
			{"carve", "4", netip.MustParsePrefix("10.128.0.0/16")},
			{"blue", "4", netip.MustParsePrefix("10.64.0.0/16")},
		}
		want := map[string]*ring.Ring{}
		var sends []Data
		for _, k := range keys {
			for _, enc := range ringVersions(t, rng, k.universe, 30) {
				sends = append(sends, Data{Msg: ipamwire.RingMessage{ClusterID: "c1", Rings: []ipamwire.RingEntry{{Overlay: k.overlay, Family: k.family, Ring: enc}}}})
				r, err := ring.Decode(enc)
				if err != nil {
					t.Fatal(err)
				}
				key := k.overlay + "/" + k.family
				if want[key] == nil {
					want[key] = r
				} else if _, err := want[key].Merge(r); err != nil {
					t.Fatalf("seed %d: reference merge: %v", seed, err)
				}
			}
		}
		// A bad encoding on the way is dropped for the valid rings.
		sends = append(sends, Data{Msg: ipamwire.RingMessage{Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: []byte("garbage")}}}})
		rng.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })
		var pending Data = sends[0]
		for _, d := range sends[1:] {
			pending = pending.Merge(d).(Data)
		}
		if pending.Msg.ClusterID != "c1" {
			t.Errorf("seed %d: cluster id %q", seed, pending.Msg.ClusterID)
		}
		if len(pending.Msg.Rings) != len(keys) {
			t.Fatalf("seed %d: %d rings after coalescing, want one per key (%d)", seed, len(pending.Msg.Rings), len(keys))
		}
		for _, e := range pending.Msg.Rings {
			got, err := ring.Decode(e.Ring)
			if err != nil {
				t.Fatalf("seed %d: %s/%s: %v", seed, e.Overlay, e.Family, err)
			}
			if w := want[e.Overlay+"/"+e.Family]; !got.Equal(w) {
				t.Errorf("seed %d: %s/%s is not the merge of every version:\ngot  %v\nwant %v", seed, e.Overlay, e.Family, got, w)
			}
		}
	}
}

// TestRingDataMergeAcrossClusters: pending data of a cluster that was
// rebuilt since gives way to the new cluster's.
func TestRingDataMergeAcrossClusters(t *testing.T) {
	enc := ringVersions(t, rand.New(rand.NewPCG(1, 1)), netip.MustParsePrefix("10.128.0.0/16"), 2)
	old := Data{Msg: ipamwire.RingMessage{ClusterID: "old", Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: enc[0]}}}}
	cur := Data{Msg: ipamwire.RingMessage{ClusterID: "new", Rings: []ipamwire.RingEntry{{Overlay: "carve", Family: "4", Ring: enc[1]}}}}
	got := old.Merge(cur).(Data)
	if got.Msg.ClusterID != "new" || len(got.Msg.Rings) != 1 || !bytes.Equal(got.Msg.Rings[0].Ring, enc[1]) {
		t.Errorf("merge across clusters kept %+v", got.Msg)
	}
}
