package ring

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"testing"
)

// blocksByScan and rangesByScan are Blocks and RangesOf computed by a scan
// of the whole view (ownedIvals), the way they were before the owner
// index: the reference the indexed queries must equal.
func blocksByScan(r *Ring, peer string) []netip.Prefix {
	var out []netip.Prefix
	for _, v := range coalesce(ownedIvals(r.u, r.st.view, peer)) {
		out = append(out, r.u.rangeOf(v.lo, v.hi).Prefixes()...)
	}
	return out
}

func rangesByScan(r *Ring, peer string) []Range {
	var out []Range
	for _, v := range ownedIvals(r.u, r.st.view, peer) {
		out = append(out, r.u.rangeOf(v.lo, v.hi))
	}
	return out
}

// checkOwnerQueries compares the indexed queries with the scans for every
// owner of r, for nobody ("") and for an owner of nothing.
func checkOwnerQueries(t testing.TB, r *Ring, what string) {
	t.Helper()
	for _, p := range append(r.Peers(), "", "nobody") {
		if got, want := r.Blocks(p), blocksByScan(r, p); !slices.Equal(got, want) {
			t.Fatalf("%s: Blocks(%q) = %v, the scan gives %v\n%v", what, p, got, want, r)
		}
		if got, want := r.RangesOf(p), rangesByScan(r, p); !slices.Equal(got, want) {
			t.Fatalf("%s: RangesOf(%q) = %v, the scan gives %v\n%v", what, p, got, want, r)
		}
	}
}

// TestOwnerIndexMatchesScan checks Blocks and RangesOf through the owner
// index against a scan of the view: on arbitrary states, and along
// histories of seeds, grants and merges, where each change
// makes a new state whose index must not be the previous one's.
func TestOwnerIndexMatchesScan(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		r := randomRing(t, rand.New(rand.NewPCG(seed, 7)))
		checkOwnerQueries(t, r, fmt.Sprintf("random ring, seed %d", seed))
	}
	for seed := uint64(1); seed <= 20; seed++ {
		h := newHistory(t, seed)
		for step := range 150 {
			h.step()
			for _, id := range h.live {
				// The allocator's own ring, queried before and after
				// each change: a stale index would show here.
				checkOwnerQueries(t, h.peers[id].ring, fmt.Sprintf("history seed %d, step %d, peer %s", seed, step, id))
			}
		}
	}
}

// TestOwnerIndexAfterChange queries a ring, changes it, and queries it
// again: the blocks are the new state's.
func TestOwnerIndexAfterChange(t *testing.T) {
	a := mustAllocator(t, "a", "10.0.0.0/16")
	mustSeedAllocator(t, a, []Lease{{"b", pfx(t, "10.0.1.0/24"), 1}})
	if got := a.ring.Blocks("b"); !slices.Equal(got, []netip.Prefix{pfx(t, "10.0.1.0/24")}) {
		t.Fatalf("Blocks(b) = %v", got)
	}
	mustSeedAllocator(t, a, []Lease{{"b", pfx(t, "10.0.2.0/24"), 2}, {"c", pfx(t, "10.0.3.0/24"), 3}})
	if got, want := a.ring.Blocks("b"), []netip.Prefix{pfx(t, "10.0.1.0/24"), pfx(t, "10.0.2.0/24")}; !slices.Equal(got, want) {
		t.Fatalf("after the second seed, Blocks(b) = %v, want %v", got, want)
	}
	if got, want := a.ring.Blocks("c"), []netip.Prefix{pfx(t, "10.0.3.0/24")}; !slices.Equal(got, want) {
		t.Fatalf("after the second seed, Blocks(c) = %v, want %v", got, want)
	}
	checkOwnerQueries(t, a.ring, "after the second seed")
}

// TestOwnerIndexConcurrentClones queries clones of one state from several
// goroutines at once, as holders of Allocator.Ring copies may: the index
// is built once and read by all (run with -race).
func TestOwnerIndexConcurrentClones(t *testing.T) {
	a := mustAllocator(t, "self", "10.0.0.0/16")
	var leases []Lease
	for i := range 200 {
		leases = append(leases, Lease{fmt.Sprintf("p%03d", i), netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), 0}), 24), uint64(i + 1)})
	}
	mustSeedAllocator(t, a, leases)
	r := a.Ring()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		c := r.Clone()
		wg.Go(func() {
			for _, l := range leases {
				if got := c.Blocks(l.Owner); !slices.Equal(got, []netip.Prefix{l.Prefix}) {
					errs <- fmt.Errorf("Blocks(%s) = %v, want %v", l.Owner, got, l.Prefix)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func mustSeedAllocator(t testing.TB, a *Allocator, leases []Lease) {
	t.Helper()
	if _, err := a.Seed(leases, nil); err != nil {
		t.Fatalf("seed: %v", err)
	}
}

// BenchmarkBlocksEveryPeer asks for the blocks of every peer of a ring of
// n /24 leases, as an agent's reconcile does (agent/ipam PeerBlocks), on a
// fresh clone each time as it gets one: through the owner index, beside
// the scan of the whole view per peer it replaced.
func BenchmarkBlocksEveryPeer(b *testing.B) {
	for _, n := range []int{1000, 5000, 10000} {
		a := mustAllocator(b, "self", "10.0.0.0/8")
		var leases []Lease
		for i := range n {
			leases = append(leases, Lease{fmt.Sprintf("p%05d", i), netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24), uint64(i + 1)})
		}
		mustSeedAllocator(b, a, leases)
		peers := a.Ring().Peers()
		for _, m := range []struct {
			name   string
			blocks func(*Ring, string) []netip.Prefix
		}{{"indexed", (*Ring).Blocks}, {"scan", blocksByScan}} {
			b.Run(fmt.Sprintf("%s/%d", m.name, n), func(b *testing.B) {
				for b.Loop() {
					r := a.Ring()
					for _, p := range peers {
						m.blocks(r, p)
					}
				}
			})
		}
	}
}
