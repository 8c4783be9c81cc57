package mesh

// What topology gossip costs, measured on synthetic topologies (carve's
// patch; see PATCHED.md). The messages are the ones the router builds and
// the exchange runs through the router's own handlers; only the transport
// is left out.

import (
	"bytes"
	"encoding/gob"
	"fmt"
	"io/ioutil"
	"log"
	"time"
)

// TopologyBytesSent is how many bytes of topology gossip (whole topologies,
// updates, and the digest exchange) this router has made for sending so
// far, counting each message's tag and body but not the connection's framing
// and encryption.
func (router *Router) TopologyBytesSent() uint64 {
	return router.topologyChannel.sentBytes() + router.syncChannel.sentBytes()
}

// TopologyCost is what topology gossip puts on one connection in a topology
// of Peers peers with Degree connections each. Sizes are in bytes: the
// message's tag and body, without the connection's framing and encryption
// (about 20 bytes a message with a password).
type TopologyCost struct {
	Peers, Degree int
	// Full is upstream mesh's periodic message: the whole topology, sent to
	// each of a few random neighbours every gossip interval (and still to
	// a new neighbour, once, and to neighbours that take no digests).
	Full int
	// Digest is the periodic message to a neighbour that takes digests.
	Digest int
	// Change is the update for one new connection between two peers: the
	// two entries that changed, relayed as news.
	Change int
	// Repair is the whole exchange, Digest included, that brings a
	// neighbour which missed that update up to date, in RepairMessages
	// messages.
	Repair, RepairMessages int
}

// MeasureTopologyCost builds a ring lattice of n peers, each connected to
// its degree nearest (degree even), in two routers that are neighbours in
// it, and measures the messages above. It checks that the two digests agree
// before the change and after the repair. The two routers are never started
// (nothing listens), but mesh has no way to stop the goroutines NewRouter
// starts: they stay behind, idle.
func MeasureTopologyCost(n, degree int) (TopologyCost, error) {
	cost := TopologyCost{Peers: n, Degree: degree}
	if degree < 2 || degree%2 != 0 || degree >= n {
		return cost, fmt.Errorf("topology cost: degree %d for %d peers", degree, n)
	}
	name := func(i int) PeerName {
		return PeerNameFromBin([]byte{0x02, 0x42, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)})
	}
	nick := func(i int) string { return fmt.Sprintf("%08x-5c1e-4f7a-9d2b-%012x", i, i) }
	addr := func(i int) string { return fmt.Sprintf("198.18.%d.%d:6783", i/250, i%250+1) }
	neighbours := func(i int) []int {
		var out []int
		for d := 1; d <= degree/2; d++ {
			out = append(out, (i+d)%n, (i-d+n)%n)
		}
		return out
	}
	interval := 24 * time.Hour
	logger := log.New(ioutil.Discard, "", 0)
	var routers [2]*Router
	for i := range routers {
		r, err := NewRouter(Config{GossipInterval: &interval, ConnLimit: degree + 1}, name(i), nick(i), nil, logger)
		if err != nil {
			return cost, err
		}
		for _, j := range neighbours(i) {
			remote := r.Peers.fetchWithDefault(newPeerPlaceholder(name(j))) // a reference, as a connection holds
			r.Ourself.addConnection(newRemoteConnection(r.Ourself.Peer, remote, addr(j), i < j, true))
		}
		routers[i] = r
	}
	a, b := routers[0], routers[1]

	// Every entry, as its owner would encode it.
	entry := func(i int, version uint64, extra ...int) *Peer {
		p := newPeer(name(i), nick(i), PeerUID(mix64(uint64(i)+1)), version, PeerShortID(i&(1<<peerShortIDBits-1)))
		if i < len(routers) {
			o := routers[i].Ourself
			o.RLock()
			p.UID, p.Version, p.ShortID = o.UID, o.Version, o.ShortID
			o.RUnlock()
		}
		for _, j := range append(neighbours(i), extra...) {
			p.connections[name(j)] = newRemoteConnection(p, newPeerPlaceholder(name(j)), addr(j), i < j, true)
		}
		return p
	}
	encode := func(ps ...*Peer) []byte {
		buf := new(bytes.Buffer)
		enc := gob.NewEncoder(buf)
		for _, p := range ps {
			p.encode(enc)
		}
		return buf.Bytes()
	}
	all := make([]*Peer, n)
	for i := range all {
		all[i] = entry(i, uint64(i%7+degree))
	}
	for _, r := range routers {
		if _, err := r.OnGossip(encode(all...)); err != nil {
			return cost, err
		}
	}
	if da, db := a.Peers.digestMsg(), b.Peers.digestMsg(); !bytes.Equal(da, db) {
		return cost, fmt.Errorf("topology cost: the two routers' digests differ after the same topology")
	}
	// The size of the message makeMsg would make (without counting it).
	wire := func(c *gossipChannel, payload []byte) int {
		return 1 + len(gobEncode(c.name, c.ourself.Name, payload))
	}
	cost.Full = wire(a.topologyChannel, a.Peers.encodePeers(a.Peers.names()))
	digest := a.Peers.digestMsg()
	cost.Digest = wire(a.syncChannel, digest)

	// One new connection between two peers far from a and b: both
	// entries change. a learns of it, b misses it.
	k, m := n/2, (n/2+degree/2+1)%n
	change := encode(entry(k, all[k].Version+1, m), entry(m, all[m].Version+1, k))
	cost.Change = wire(a.topologyChannel, change)
	if news, err := a.OnGossip(change); err != nil || news == nil {
		return cost, fmt.Errorf("topology cost: the change was no news to a (%v)", err)
	}

	// The exchange, starting from a's periodic digest to b.
	type hop struct {
		from, to *Router
		sync     []byte      // a message on the sync channel, or
		entries  peerNameSet // topology entries
	}
	queue := []hop{{from: a, to: b, sync: a.Peers.digestMsg()}}
	for len(queue) > 0 {
		if cost.RepairMessages > 10 {
			return cost, fmt.Errorf("topology cost: the exchange did not end")
		}
		h := queue[0]
		queue = queue[1:]
		cost.RepairMessages++
		if h.sync == nil {
			payload := h.from.Peers.encodePeers(h.entries)
			cost.Repair += wire(h.from.topologyChannel, payload)
			if _, err := h.to.OnGossip(payload); err != nil {
				return cost, err
			}
			continue
		}
		cost.Repair += wire(h.from.syncChannel, h.sync)
		reply, send, err := h.to.Peers.handleTopologySync(h.sync)
		if err != nil {
			return cost, err
		}
		if len(send) > 0 {
			queue = append(queue, hop{from: h.to, to: h.from, entries: send})
		}
		if reply != nil {
			queue = append(queue, hop{from: h.to, to: h.from, sync: reply})
		}
	}
	if da, db := a.Peers.digestMsg(), b.Peers.digestMsg(); !bytes.Equal(da, db) {
		return cost, fmt.Errorf("topology cost: the exchange left the digests different")
	}
	return cost, nil
}
