// Package ringgossip is the gossip of an agent's rings on the ring channel
// (ipam.RingChannel): it announces what this agent wrote since its last
// announcement (a broadcast of each changed ring's delta since what the
// other agents hold), merges what it receives through its owner (the IPAM,
// Rings), relays the news, and repairs what a broadcast missed with the
// anti-entropy protocol of package antientropy over each served ring's
// claims (digest, bucket hashes, push, push back). It keeps, per served
// ring, what the other agents hold (the known ring) and its bucket hashes.
// The messages and their bytes are package ipamwire's; the space requests
// that travel on the same channel are handed to the owner (Rings.OnSpace).
//
// Lock order: the owner's lock (Rings.Read), then the gossip's own; the
// gossip never calls its owner with its own lock held.
//
// Its exported surface is this file.
package ringgossip

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/antientropy"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// ErrOtherCluster marks a ring or space message of another masters'
// cluster: its leases carry Raft indexes of another log and are refused
// whole.
var ErrOtherCluster = errors.New("ring message of another cluster")

// Ring gossip results, the label of carve_agent_ring_gossip_messages_total.
const (
	ResultNews         = "news"          // changed at least one ring
	ResultKnown        = "known"         // changed nothing
	ResultBad          = "bad"           // could not be decoded
	ResultOtherCluster = "other_cluster" // from another masters' cluster: refused
	ResultRefused      = "refused"       // a ring refused (takeover, other universe, invalid)
)

// NewResultsCounter is carve_agent_ring_gossip_messages_total, every
// result at 0.
func NewResultsCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_agent_ring_gossip_messages_total", Help: "Ring gossip received, by result (news, known, bad, other_cluster, refused).",
	}, []string{"result"})
	for _, r := range []string{ResultNews, ResultKnown, ResultBad, ResultOtherCluster, ResultRefused} {
		c.WithLabelValues(r)
	}
	return c
}

// ID names a ring: an overlay and a family ("4", "6").
type ID struct{ Overlay, Family string }

// Rings is the owner of the served rings (the IPAM).
type Rings interface {
	// Read runs f with the served rings, under the owner's lock.
	Read(f func(Served))
	// Merge merges remote rings (or parts) into the served ones, durable
	// once it returns, and returns what was news: the deltas of the rings
	// it changed. A message of another cluster is refused with an error
	// wrapping ErrOtherCluster.
	Merge(m ipamwire.RingMessage) (ipamwire.RingMessage, error)
	// Channel is the ring channel (nil: none yet).
	Channel() gossip.Channel
	// OnSpace handles a space request or answer received by unicast.
	OnSpace(src string, msg []byte) error
}

// Served is the served rings while the owner's lock is held.
type Served interface {
	ClusterID() string
	// Allocator returns a served ring's allocator (nil: not served).
	Allocator(id ID) *ring.Allocator
	// Each calls f for every served ring, in order, after writing its
	// free counts into it when syncFree is set. Free counts are written
	// only where they are announced at once (Announce): a digest of
	// counts no broadcast carried yet would start anti-entropy that
	// races the broadcast, and a receiver that got the push first would
	// not relay it.
	Each(syncFree bool, f func(id ID, a *ring.Allocator))
}

// Config configures a Gossip.
type Config struct {
	// Self is this agent's id.
	Self  string
	Rings Rings
	Log   *slog.Logger
	// Results counts what was received (NewResultsCounter).
	Results *prometheus.CounterVec
	// OnSent, when set, counts the bytes sent, by kind (delta, digest,
	// buckets, push).
	OnSent func(kind string, n int)
}

// Gossip is the gossip of the served rings.
type Gossip struct {
	self    string
	rings   Rings
	log     *slog.Logger
	results *prometheus.CounterVec
	onSent  func(kind string, n int)
	// kick asks the owner to Announce (Kicked).
	kick chan struct{}

	mu    sync.Mutex
	state map[ID]*ringState
}

// ringState is what the gossip of one ring keeps.
type ringState struct {
	// known joins what the other agents hold or derive themselves: what
	// this agent announced, what it received, and the masters' leases it
	// seeded. A broadcast sends the ring's delta since known.
	known *ring.Ring
	// announced is the ring's change count at the last announcement.
	announced uint64
	// changes and buckets cache the ring's bucket hashes at its default
	// count (its digest is their XOR), valid at that change count.
	changes uint64
	buckets antientropy.Buckets
}

// New returns the gossip of cfg.Rings.
func New(cfg Config) *Gossip {
	return &Gossip{self: cfg.Self, rings: cfg.Rings, log: cfg.Log, results: cfg.Results, onSent: cfg.OnSent,
		kick: make(chan struct{}, 1), state: map[ID]*ringState{}}
}

// Kicked fires when the gossip asks its owner to Announce (from gossip
// callbacks, which must not broadcast themselves).
func (g *Gossip) Kicked() <-chan struct{} { return g.kick }

// Known applies f to a served ring's known ring: what every agent derives
// alike (the masters' leases), what it already holds (a ring read back
// from disk) or what was received, so that it is never broadcast. The
// caller holds the owner's lock (a is the ring's allocator).
func (g *Gossip) Known(id ID, a *ring.Allocator, f func(known *ring.Ring) error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.stateOf(id, a); st.known != nil {
		if err := f(st.known); err != nil {
			g.log.Debug("known ring", "overlay", id.Overlay, "family", id.Family, "err", err)
		}
	}
}

// Forget drops the gossip state of an overlay's rings (retired: its next
// rings start over).
func (g *Gossip) Forget(overlay string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, fam := range []string{"4", "6"} {
		delete(g.state, ID{overlay, fam})
	}
}

// Announce broadcasts, of every served ring, the entries the other agents
// do not hold yet: what this agent wrote since its last announcement (a
// grant, a return, free counts). Nothing, when nothing changed.
func (g *Gossip) Announce() {
	var m ipamwire.RingMessage
	g.rings.Read(func(sv Served) {
		m.ClusterID = sv.ClusterID()
		sv.Each(true, func(id ID, a *ring.Allocator) {
			g.mu.Lock()
			defer g.mu.Unlock()
			st := g.stateOf(id, a)
			if st.announced == a.RingChanges() {
				return
			}
			st.announced = a.RingChanges()
			if d, ok := a.Ring().Delta(st.known); ok {
				m.Rings = append(m.Rings, ipamwire.RingEntry{Overlay: id.Overlay, Family: id.Family, Ring: d.Claims().Encode()})
				if _, err := st.known.Merge(d); err != nil {
					g.log.Debug("known ring", "overlay", id.Overlay, "family", id.Family, "err", err)
				}
			}
		})
	})
	g.Broadcast(m)
}

// stateOf returns the gossip state of a served ring; g.mu is held.
func (g *Gossip) stateOf(id ID, a *ring.Allocator) *ringState {
	st := g.state[id]
	if st == nil {
		st = &ringState{}
		g.state[id] = st
	}
	if u := a.Ring().Universe(); st.known == nil || st.known.Universe() != u {
		st.known, _ = ring.NewRing(u) // the allocator's universe: valid
		st.changes, st.buckets = 0, nil
	}
	return st
}

// Broadcast sends changed rings on the ring channel.
func (g *Gossip) Broadcast(m ipamwire.RingMessage) {
	if len(m.Rings) == 0 {
		return
	}
	if ch := g.rings.Channel(); ch != nil {
		ch.Broadcast(Data{Msg: m, Sent: g.onSent})
	}
}

// unicast sends a ring message to one peer.
func (g *Gossip) unicast(dst, kind string, m ipamwire.RingMessage) {
	ch := g.rings.Channel()
	if ch == nil {
		return
	}
	b := ipamwire.EncodeRingMessage(m)
	if err := ch.Unicast(dst, b); err != nil {
		g.log.Debug("ring anti-entropy unicast", "to", dst, "err", err)
		return
	}
	if g.onSent != nil {
		g.onSent(kind, len(b))
	}
}

// Handler is the handler of the ring channel.
func (g *Gossip) Handler() gossip.Handler { return (*handler)(g) }

// handler receives ring gossip.
type handler Gossip

// Gossip implements gossip.Handler: the digest of the served rings. It
// also has the owner announce what this agent wrote since its last
// announcement (free counts are written into the rings then, not on every
// allocation).
func (h *handler) Gossip() gossip.Data {
	g := (*Gossip)(h)
	var d []ipamwire.RingDigest
	var cluster string
	g.rings.Read(func(sv Served) {
		d = g.digest(sv)
		cluster = sv.ClusterID() // a sync changes it
	})
	select {
	case g.kick <- struct{}{}:
	default:
	}
	if len(d) == 0 {
		return nil
	}
	return Data{Msg: ipamwire.RingMessage{ClusterID: cluster, From: g.self, Digest: d}, Sent: g.onSent}
}

// Receive handles a ring message; src is the sender of a unicast ("" for
// broadcast and gossip). It returns what to relay.
func (g *Gossip) Receive(src string, msg []byte) (gossip.Data, error) {
	m, err := ipamwire.DecodeRingMessage(msg)
	if err != nil {
		g.results.WithLabelValues(ResultBad).Inc()
		return nil, err
	}
	var cluster string
	g.rings.Read(func(sv Served) { cluster = sv.ClusterID() })
	if cluster != "" && m.ClusterID != "" && m.ClusterID != cluster {
		g.results.WithLabelValues(ResultOtherCluster).Inc()
		return nil, fmt.Errorf("%w: %q", ErrOtherCluster, m.ClusterID)
	}
	if m.Digest != nil && m.From != g.self {
		if ans := g.answerDigest(m); len(ans.Buckets) > 0 {
			g.unicast(m.From, "buckets", ans)
		}
	}
	if len(m.Buckets) > 0 && src != "" {
		if push := g.answerBuckets(m); len(push.Rings) > 0 {
			g.unicast(src, "push", push)
		}
	}
	if len(m.Rings) == 0 {
		return nil, nil
	}
	news, err := g.rings.Merge(m)
	switch {
	case errors.Is(err, ErrOtherCluster):
		g.results.WithLabelValues(ResultOtherCluster).Inc()
	case err != nil:
		g.results.WithLabelValues(ResultRefused).Inc()
	}
	if src != "" && err == nil {
		if back := g.pushBack(m); len(back.Rings) > 0 {
			g.unicast(src, "push", back)
		}
	}
	if len(news.Rings) == 0 {
		if err == nil {
			g.results.WithLabelValues(ResultKnown).Inc()
		}
		return nil, err
	}
	g.results.WithLabelValues(ResultNews).Inc()
	if src != "" {
		return nil, err // merged, not relayed: each agent runs its own anti-entropy
	}
	return Data{Msg: news, Sent: g.onSent}, err
}

// OnGossip implements gossip.Handler.
func (h *handler) OnGossip(msg []byte) (gossip.Data, error) { return (*Gossip)(h).Receive("", msg) }

// OnBroadcast implements gossip.Handler.
func (h *handler) OnBroadcast(_ string, msg []byte) (gossip.Data, error) {
	return (*Gossip)(h).Receive("", msg)
}

// OnUnicast implements gossip.Handler. Two kinds of message travel by
// unicast on the ring channel: space requests and their answers (growth),
// which always carry a "kind", and anti-entropy messages (bucket hashes,
// pushes), which never do (merged and not relayed).
func (h *handler) OnUnicast(src string, msg []byte) error {
	g := (*Gossip)(h)
	if ipamwire.IsSpaceMessage(msg) {
		return g.rings.OnSpace(src, msg)
	}
	_, err := g.Receive(src, msg)
	return err
}

// Data is a ring message as gossip data.
type Data struct {
	Msg ipamwire.RingMessage
	// Sent, when set, counts the bytes of every encoding.
	Sent func(kind string, n int)
}

// Encode implements gossip.Data.
func (d Data) Encode() [][]byte {
	b := ipamwire.EncodeRingMessage(d.Msg)
	if d.Sent != nil {
		d.Sent(d.Msg.Kind(), len(b))
	}
	return [][]byte{b}
}

// Merge implements gossip.Data as a join (ipamwire.JoinRingMessages): mesh
// merges pending data (d) with new data (other).
func (d Data) Merge(other gossip.Data) gossip.Data {
	o, ok := other.(Data)
	if !ok {
		return d
	}
	sent := o.Sent
	if sent == nil {
		sent = d.Sent
	}
	return Data{Msg: ipamwire.JoinRingMessages(d.Msg, o.Msg), Sent: sent}
}
