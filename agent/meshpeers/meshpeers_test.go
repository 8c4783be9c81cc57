package meshpeers

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/carve-net/carve/agent/membership"
)

func candidates(n int) []meshCandidate {
	var out []meshCandidate
	for i := range n {
		out = append(out, meshCandidate{id: fmt.Sprintf("agent-%04d", i), addr: fmt.Sprintf("198.18.%d.%d:6783", i/250, i%250+1)})
	}
	return out
}

func ids(cs []meshCandidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.id)
	}
	return out
}

// TestPickMeshPeers: each agent picks k peers, the same ones every time
// and in any order of the candidates; the picks are spread (no agent is
// picked by many more than k others); a peer that goes away is replaced
// by the next one and the rest stay; a chosen peer that does not connect
// within its grace gets the next candidate beside it, up to 2k.
func TestPickMeshPeers(t *testing.T) {
	const n, k = 1000, 12
	up := func(string) bool { return true }
	in := map[string]int{}
	// The candidates are built once (2n Sprintfs): each agent picks from a
	// copy without itself.
	all := candidates(n)
	for _, self := range ids(all) {
		cs := slices.DeleteFunc(slices.Clone(all), func(c meshCandidate) bool { return c.id == self })
		got := ids(pickMeshPeers(self, cs, k, up))
		if len(got) != k {
			t.Fatalf("%s picked %d peers", self, len(got))
		}
		slices.Reverse(cs)
		if again := ids(pickMeshPeers(self, cs, k, up)); !slices.Equal(got, again) {
			t.Fatalf("%s picked %v, then %v from the same candidates", self, got, again)
		}
		for _, id := range got {
			in[id]++
		}
	}
	most := 0
	for _, c := range in {
		most = max(most, c)
	}
	if most > 3*k {
		t.Fatalf("an agent is picked by %d others (k=%d): the picks are not spread", most, k)
	}

	self := "agent-0000"
	cs := candidates(n)[1:]
	first := ids(pickMeshPeers(self, slices.Clone(cs), k, up))
	gone := first[3]
	after := ids(pickMeshPeers(self, slices.DeleteFunc(slices.Clone(cs), func(c meshCandidate) bool { return c.id == gone }), k, up))
	if kept := slices.DeleteFunc(slices.Clone(after), func(id string) bool { return !slices.Contains(first, id) }); len(kept) != k-1 || slices.Contains(after, gone) {
		t.Fatalf("after %s went away: %v (before %v)", gone, after, first)
	}
	down := ids(pickMeshPeers(self, slices.Clone(cs), k, func(id string) bool { return id != first[0] && id != first[1] }))
	if len(down) != k+2 || !slices.Equal(down[:k], first) {
		t.Fatalf("with two chosen peers unreachable: %v, want %v and two more", down, first)
	}
	none := ids(pickMeshPeers(self, slices.Clone(cs), k, func(string) bool { return false }))
	if len(none) != 2*k {
		t.Fatalf("with no peer reachable: %d picked, want %d", len(none), 2*k)
	}
}

// TestPickMeshPeersIsTheLowestRanks: the choice is the candidates sorted
// by rank (then id), taken in order as the grace allows, whatever the
// number of candidates against 2k (keeping the lowest 2k of them must
// choose exactly what sorting them all did).
func TestPickMeshPeersIsTheLowestRanks(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 3))
		n, k := rng.IntN(80), 1+rng.IntN(16)
		cs := candidates(n)
		rng.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
		down := map[string]bool{}
		for _, c := range cs {
			down[c.id] = rng.IntN(3) == 0
		}
		up := func(id string) bool { return !down[id] }
		got := ids(pickMeshPeers("self", slices.Clone(cs), k, up))

		sorted := slices.Clone(cs)
		for i := range sorted {
			sorted[i].rank = membership.Hash64([]byte("self"), []byte(sorted[i].id))
		}
		slices.SortFunc(sorted, func(x, y meshCandidate) int {
			return cmp.Or(cmp.Compare(x.rank, y.rank), cmp.Compare(x.id, y.id))
		})
		var want []string
		limit := k
		for _, c := range sorted {
			if len(want) >= limit {
				break
			}
			want = append(want, c.id)
			if down[c.id] && limit < 2*k {
				limit++
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d (%d candidates, k=%d): picked %v, sorting all gives %v", seed, n, k, got, want)
		}
	}
}
