// Package meshpeers chooses the peers an agent keeps mesh connections to:
// a bounded set, by rendezvous hashing of its id with each peer's
// (deterministic, spread evenly over the cluster, stable as agents come
// and go), where a chosen peer that does not connect for a while gets the
// next candidate beside it. Mesh routes broadcasts along a spanning tree
// of its topology and unicasts through neighbours, so it needs no full
// mesh. A Set remembers the addresses handed to the mesh router and says
// which to connect and which to forget: mesh retries every address it was
// given for ever.
package meshpeers

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/carve-net/carve/agent/membership"
)

// DefaultPeers is how many peers an agent keeps mesh connections to:
// enough that the topology stays connected when several go away at once
// (a random graph where each node picks k >= 2 others is connected with
// high probability), few enough that connections and mesh's topology
// gossip stay small at thousands of agents.
const DefaultPeers = 12

// Set is the mesh peers of one agent; its methods are safe for concurrent
// use.
type Set struct {
	self string
	k    int
	mu   sync.Mutex
	// connected maps the mesh addresses handed to the router to their
	// agent ids; dialing the chosen peers not connected yet to since when.
	connected map[string]string
	dialing   map[string]time.Time
}

// New returns the mesh peers of agent self, k of them (0 or less:
// DefaultPeers).
func New(self string, k int) *Set {
	if k <= 0 {
		k = DefaultPeers
	}
	return &Set{self: self, k: k, connected: map[string]string{}, dialing: map[string]time.Time{}}
}

// Update chooses the peers among those of the membership (peers, and
// known: the ids it holds a record or a tombstone of), given the router's
// direct neighbours (nil: the router does not tell, and every chosen peer
// counts as connected), and returns the addresses to connect and those to
// forget (sorted), and how many peers are chosen. Addresses the router no
// longer needs are forgotten: a deleted agent's, the old one of an agent
// that moved, one that left the set. While the membership names no peer
// at all (reset by a rebuild), the addresses are kept.
func (s *Set) Update(peers []membership.MeshPeer, known map[string]bool, neighbours []string, now time.Time) (connect, forget []string, chosen int) {
	cands := make([]meshCandidate, len(peers))
	for i, p := range peers {
		cands[i] = meshCandidate{id: p.ID, addr: p.Addr}
	}
	var connected map[string]bool
	if neighbours != nil {
		connected = make(map[string]bool, len(neighbours))
		for _, id := range neighbours {
			connected[id] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	picked := pickMeshPeers(s.self, cands, s.k, func(id string) bool {
		if connected == nil || connected[id] {
			delete(s.dialing, id)
			return true
		}
		since, ok := s.dialing[id]
		if !ok {
			s.dialing[id] = now
			return true
		}
		return now.Sub(since) < meshDialGrace
	})
	want := map[string]string{} // mesh address -> agent id
	for _, c := range picked {
		want[c.addr] = c.id
	}
	for id := range s.dialing {
		if !slices.ContainsFunc(picked, func(c meshCandidate) bool { return c.id == id }) && !slices.ContainsFunc(cands, func(c meshCandidate) bool { return c.id == id }) {
			delete(s.dialing, id)
		}
	}
	for addr, id := range s.connected {
		if _, ok := want[addr]; !ok && (known[id] || len(cands) > 0) {
			forget = append(forget, addr)
			delete(s.connected, addr)
		}
	}
	for addr, id := range want {
		if _, ok := s.connected[addr]; !ok {
			connect = append(connect, addr)
		}
		s.connected[addr] = id
	}
	slices.Sort(connect)
	slices.Sort(forget)
	return connect, forget, len(want)
}

// meshDialGrace is how long a chosen peer may stay unconnected before the
// next candidate is tried in its place (it stays chosen too, up to twice
// the number of peers in all).
const meshDialGrace = 30 * time.Second

// meshCandidate is a peer the agent could connect to.
type meshCandidate struct {
	id, addr string
	rank     uint64
}

// pickMeshPeers chooses the peers to connect to: the k candidates of
// lowest rendezvous rank hash(self, peer), so that each agent's choice is
// spread over the cluster and changes little when agents come and go.
// up tells whether a chosen peer is connected or still within its grace;
// for each that is not, one more candidate is chosen (up to 2k). cands
// is not reordered.
func pickMeshPeers(self string, cands []meshCandidate, k int, up func(id string) bool) []meshCandidate {
	if k <= 0 {
		k = DefaultPeers
	}
	for i := range cands {
		cands[i].rank = membership.Hash64([]byte(self), []byte(cands[i].id))
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
