package agent

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/carve-net/carve/agent/membership"
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

// connectLoop keeps the mesh connections (connectPeers) whenever the
// membership changed (coalesced).
func (a *Agent) connectLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.connectCh:
			a.connectPeers()
		}
	}
}

// connectPeers keeps the router connected to a bounded set of peers
// (Config.MeshPeers): mesh routes broadcasts along a spanning tree of its
// topology and unicasts through neighbours, so it needs no full mesh. The
// set is chosen by rendezvous hashing of this agent's id with each peer's
// (pickMeshPeers): deterministic, spread evenly, and stable as agents come
// and go; a chosen peer that does not connect for a while is replaced by
// the next. Addresses the router no longer needs are forgotten (a deleted
// agent's, the old one of an agent that moved, one that left the set):
// mesh retries every address it was given for ever. While the membership
// names no peer at all (reset by a rebuild), the addresses are kept.
func (a *Agent) connectPeers() {
	peers, known := a.members.MeshPeers(a.id)
	cands := make([]meshCandidate, len(peers))
	for i, p := range peers {
		cands[i] = meshCandidate{id: p.ID, addr: p.Addr}
	}
	var connected map[string]bool
	if n, ok := a.router.(neighbourer); ok {
		connected = map[string]bool{}
		for _, id := range n.Neighbours() {
			connected[id] = true
		}
	}
	now := time.Now()
	a.mu.Lock()
	chosen := pickMeshPeers(a.id, cands, a.cfg.MeshPeers, func(id string) bool {
		if connected == nil || connected[id] {
			delete(a.dialing, id)
			return true
		}
		since, ok := a.dialing[id]
		if !ok {
			a.dialing[id] = now
			return true
		}
		return now.Sub(since) < meshDialGrace
	})
	want := map[string]string{} // mesh address -> agent id
	for _, c := range chosen {
		want[c.addr] = c.id
	}
	for id := range a.dialing {
		if !slices.ContainsFunc(chosen, func(c meshCandidate) bool { return c.id == id }) && !slices.ContainsFunc(cands, func(c meshCandidate) bool { return c.id == id }) {
			delete(a.dialing, id)
		}
	}
	var connect, forget []string
	for addr, id := range a.connected {
		if _, ok := want[addr]; !ok && (known[id] || len(cands) > 0) {
			forget = append(forget, addr)
			delete(a.connected, addr)
		}
	}
	for addr, id := range want {
		if _, ok := a.connected[addr]; !ok {
			connect = append(connect, addr)
		}
		a.connected[addr] = id
	}
	a.mu.Unlock()
	a.metrics.meshTargets.Set(float64(len(want)))
	if len(forget) > 0 {
		slices.Sort(forget)
		a.log.Debug("forgetting mesh peers", "addrs", forget)
		if err := a.router.Forget(forget...); err != nil {
			a.log.Warn("forget mesh peers", "err", err)
		}
	}
	if len(connect) > 0 {
		slices.Sort(connect)
		if err := a.router.Connect(connect...); err != nil {
			a.log.Warn("connect to mesh peers", "err", err)
		}
	}
}
