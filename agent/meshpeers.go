package agent

import (
	"cmp"
	"slices"
	"time"
)

// DefaultMeshPeers is how many peers an agent keeps mesh connections to:
// enough that the topology stays connected when several go away at once
// (a random graph where each node picks k >= 2 others is connected with
// high probability), few enough that connections and mesh's topology
// gossip stay small at thousands of agents.
const DefaultMeshPeers = 12

// meshDialGrace is how long a chosen peer may stay unconnected before the
// next candidate is tried in its place (it stays chosen too, up to twice
// Config.MeshPeers in all).
const meshDialGrace = 30 * time.Second

// neighbourer is implemented by routers that tell which peers they are
// connected to directly (gossip.MeshRouter).
type neighbourer interface {
	Neighbours() []string
}

// meshCandidate is a peer the agent could connect to.
type meshCandidate struct {
	id, addr string
	rank     uint64
}

// meshCandidates lists the other agents with a mesh address, and the ids
// with a record or a tombstone.
func (m *Membership) meshCandidates(self string) ([]meshCandidate, map[string]bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	known := make(map[string]bool, len(m.records)+len(m.tombstones))
	var out []meshCandidate
	for id, r := range m.records {
		known[id] = true
		if id != self && r.MeshAddr != "" {
			out = append(out, meshCandidate{id: id, addr: r.MeshAddr})
		}
	}
	for id := range m.tombstones {
		known[id] = true
	}
	return out, known
}

// pickMeshPeers chooses the peers to connect to: the k candidates of
// lowest rendezvous rank hash(self, peer), so that each agent's choice is
// spread over the cluster and changes little when agents come and go.
// up tells whether a chosen peer is connected or still within its grace;
// for each that is not, one more candidate is chosen (up to 2k). cands
// is not reordered.
func pickMeshPeers(self string, cands []meshCandidate, k int, up func(id string) bool) []meshCandidate {
	if k <= 0 {
		k = DefaultMeshPeers
	}
	for i := range cands {
		cands[i].rank = hash64([]byte(self), []byte(cands[i].id))
	}
	var out []meshCandidate
	limit := k
	for _, c := range lowestRanks(cands, 2*k) {
		if len(out) >= limit {
			break
		}
		out = append(out, c)
		if !up(c.id) && limit < 2*k {
			limit++
		}
	}
	return out
}

// lowestRanks returns the n candidates of lowest rank (then id), sorted:
// only they can be chosen, and keeping n of them costs a comparison for
// most candidates where sorting them all (every 10 s, at thousands of
// agents) cost n log n.
func lowestRanks(cands []meshCandidate, n int) []meshCandidate {
	order := func(x, y meshCandidate) int {
		return cmp.Or(cmp.Compare(x.rank, y.rank), cmp.Compare(x.id, y.id))
	}
	best := make([]meshCandidate, 0, n+1)
	for _, c := range cands {
		if len(best) == n && order(c, best[n-1]) >= 0 {
			continue
		}
		i, _ := slices.BinarySearchFunc(best, c, order)
		best = slices.Insert(best, i, c)
		if len(best) > n {
			best = best[:n]
		}
	}
	return best
}
