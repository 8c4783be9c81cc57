package ring

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

// TestDeltaMergesAsTheWhole: for arbitrary states, the delta of a since b,
// merged into b or into anything above b, gives what merging all of a
// gives; it holds nothing b already holds as new.
func TestDeltaMergesAsTheWhole(t *testing.T) {
	for seed := uint64(1); seed <= 400; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		a, b, x := randomRing(t, rng), randomRing(t, rng), randomRing(t, rng)
		d, ok := a.Delta(b)
		if !ok {
			if !bytes.Equal(merged(t, b, a).Encode(), b.Encode()) {
				t.Fatalf("seed %d: Delta says b holds a, but merging a changes b:\n%v\n%v", seed, a, b)
			}
			continue
		}
		checkValid(t, d)
		for _, base := range []*Ring{b, merged(t, b, x)} {
			if got, want := merged(t, base, d), merged(t, base, a); !bytes.Equal(got.Encode(), want.Encode()) {
				t.Fatalf("seed %d: merging the delta differs from merging the whole:\n got %v\nwant %v", seed, got, want)
			}
		}
		// Nothing of a that b holds equal or newer is sent again.
		if again, ok := a.Delta(merged(t, b, a)); ok {
			t.Fatalf("seed %d: a delta since a state holding a: %v", seed, again)
		}
	}
}

// TestDeltaOfOneWrite: a free-count write sends one token (and the first),
// not the ring.
func TestDeltaOfOneWrite(t *testing.T) {
	a := mustAllocator(t, "a", "10.0.0.0/16")
	var leases []Lease
	for i, o := range []string{"a", "b", "c", "d", "e", "f"} {
		leases = append(leases, Lease{Owner: o, Prefix: pfx(t, "10.0."+string(rune('0'+i))+".0/24"), Version: 10})
	}
	if _, err := a.Seed(leases, nil); err != nil {
		t.Fatal(err)
	}
	before := a.Ring()
	if _, err := a.Allocate(Attachment{ContainerID: "c1", Interface: "eth0"}, pfx(t, "10.0.0.0/24")); err != nil {
		t.Fatal(err)
	}
	if changed, err := a.SyncFree(); err != nil || !changed {
		t.Fatalf("SyncFree: changed %v, err %v", changed, err)
	}
	d, ok := a.Ring().Delta(before)
	if !ok {
		t.Fatal("no delta after a free-count write")
	}
	if n := len(d.st.raw); n > 2 || len(d.st.leases)+len(d.st.sets)+len(d.st.tombs) != 0 {
		t.Fatalf("delta of one write holds %d tokens, %d leases: %v", n, len(d.st.leases), d)
	}
	if len(d.Encode()) >= len(a.EncodeRing())/2 {
		t.Fatalf("delta of %d bytes for a ring of %d", len(d.Encode()), len(a.EncodeRing()))
	}
}

// entriesByOwner is each owner's entries of r, as EachEntry encodes them.
func entriesByOwner(r *Ring) map[string][]string {
	out := map[string][]string{}
	r.EachEntry(func(owner string, entry []byte) { out[owner] = append(out[owner], string(entry)) })
	return out
}

// TestSelectReconciles: two arbitrary states exchanging only the entries
// of the owners whose entries differ (what anti-entropy's buckets narrow
// down to) end equal, whatever else each selection holds; the selection
// of every owner is the whole ring, and equal rings encode their entries
// alike.
func TestSelectReconciles(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		a, b := randomRing(t, rng), randomRing(t, rng)
		ea, eb := entriesByOwner(a), entriesByOwner(b)
		extra := map[string]bool{} // owners selected although equal
		differ := func(owner string) bool {
			return extra[owner] || !slices.Equal(ea[owner], eb[owner])
		}
		for o := range ea {
			if rng.IntN(3) == 0 {
				extra[o] = true
			}
		}
		fromA, fromB := a.Select(differ), b.Select(differ)
		checkValid(t, fromA)
		a2, b2 := merged(t, a, fromB), merged(t, b, fromA)
		if !bytes.Equal(a2.Encode(), b2.Encode()) {
			t.Fatalf("seed %d: not reconciled:\n%v\n%v", seed, a2, b2)
		}
		if e2a, e2b := entriesByOwner(a2), entriesByOwner(b2); !reflect.DeepEqual(e2a, e2b) {
			t.Fatalf("seed %d: equal rings, entries differ:\n%v\n%v", seed, e2a, e2b)
		}
		if whole := a.Select(func(string) bool { return true }); !whole.Equal(a) {
			t.Fatalf("seed %d: every owner is not the ring:\n%v\n%v", seed, whole, a)
		}
	}
}

// TestEachEntryCoversEveryPart: an entry of each part of the state (raw
// tokens, leases, lease sets, tombstones) is named, and a change of any
// field changes its encoding.
func TestEachEntryCoversEveryPart(t *testing.T) {
	r := newRing(t, "10.0.0.0/16")
	mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, []Tombstone{{"c", 3}})
	if _, err := r.SeedSets([]LeaseSet{{Owner: "b", Version: 7, Prefixes: []netip.Prefix{pfx(t, "10.0.2.0/24")}}}, nil); err != nil {
		t.Fatal(err)
	}
	kinds := map[byte]int{}
	r.EachEntry(func(_ string, e []byte) { kinds[e[0]]++ })
	for _, k := range []byte("tlsd") {
		if kinds[k] == 0 {
			t.Errorf("no entry of kind %q in %v", k, kinds)
		}
	}
	before := entriesByOwner(r)
	if _, err := r.ReportFree("a", map[netip.Addr]Uint128{netip.MustParseAddr("10.0.1.0"): U128(7)}); err != nil {
		t.Fatal(err)
	}
	if after := entriesByOwner(r); slices.Equal(before["a"], after["a"]) {
		t.Error("a free count changed and a's entries encode alike")
	}
}
