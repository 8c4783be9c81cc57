package ring

import (
	"bytes"
	"fmt"
	"math/rand/v2"
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

// TestBucketsReconcile: two arbitrary states exchanging only the entries of
// the buckets whose hashes differ end equal, at every bucket count; the
// buckets of all owners together are the whole ring.
func TestBucketsReconcile(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		a, b := randomRing(t, rng), randomRing(t, rng)
		for _, n := range []int{1, 2, 4, 16} {
			ha, err := a.BucketHashes(n)
			if err != nil {
				t.Fatal(err)
			}
			hb, _ := b.BucketHashes(n)
			var differ, all []int
			for i := range n {
				all = append(all, i)
				if ha[i] != hb[i] {
					differ = append(differ, i)
				}
			}
			fromA, err := a.InBuckets(n, differ)
			if err != nil {
				t.Fatal(err)
			}
			fromB, _ := b.InBuckets(n, differ)
			checkValid(t, fromA)
			a2, b2 := merged(t, a, fromB), merged(t, b, fromA)
			if !bytes.Equal(a2.Encode(), b2.Encode()) {
				t.Fatalf("seed %d, %d buckets (differing %v): not reconciled:\n%v\n%v", seed, n, differ, a2, b2)
			}
			h2a, _ := a2.BucketHashes(n)
			h2b, _ := b2.BucketHashes(n)
			for i := range n {
				if h2a[i] != h2b[i] {
					t.Fatalf("seed %d: equal rings, bucket %d hashes differ", seed, i)
				}
			}
			whole, _ := a.InBuckets(n, all)
			if !whole.Equal(a) {
				t.Fatalf("seed %d: every bucket is not the ring:\n%v\n%v", seed, whole, a)
			}
		}
	}
}

func TestBucketArguments(t *testing.T) {
	r := newRing(t, "10.0.0.0/24")
	for _, n := range []int{0, -1, 3, 12} {
		if _, err := r.BucketHashes(n); err == nil {
			t.Errorf("BucketHashes(%d) accepted", n)
		}
		if _, err := r.InBuckets(n, nil); err == nil {
			t.Errorf("InBuckets(%d) accepted", n)
		}
	}
	for _, b := range []int{-1, 4} {
		if _, err := r.InBuckets(4, []int{b}); err == nil {
			t.Errorf("InBuckets(4, [%d]) accepted", b)
		}
	}
}

// TestBucketsSpreadSimilarIDs: agent ids that differ in a few characters
// (as generated ids do) spread over every bucket, so that a push of one
// bucket stays a small part of the ring.
func TestBucketsSpreadSimilarIDs(t *testing.T) {
	for _, format := range []string{"%08x-5c1e-4f7a-9d2b-%012x", "agent-%06d%.0d"} {
		const ids, n = 5000, 256
		count := make([]int, n)
		for i := range ids {
			count[bucketOf(fmt.Sprintf(format, i, i), n)]++
		}
		if m := slices.Max(count); slices.Min(count) == 0 || m > 3*ids/n {
			t.Errorf("%q: buckets hold %d to %d ids, want all used and none above %d", format, slices.Min(count), m, 3*ids/n)
		}
	}
}
