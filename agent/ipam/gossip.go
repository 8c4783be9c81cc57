package ipam

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/antientropy"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

type ringID struct{ overlay, family string }

// ringPersistEvery is how often rings changed by other agents' entries
// only are written to disk.
const ringPersistEvery = 10 * time.Second

// ringGossip is what the gossip of one ring keeps.
type ringGossip struct {
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

// allocatorOf returns a served overlay's allocator of a family ("4", "6");
// the caller holds s.mu.
func (s *Service) allocatorOf(overlay, family string) *ring.Allocator {
	o := s.overlays[overlay]
	if o == nil || o.unserved != "" {
		return nil
	}
	if family == "6" {
		return o.alloc[1]
	}
	return o.alloc[0]
}

// rings returns every ring this agent serves.
func (s *Service) rings() ipamwire.RingMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := ipamwire.RingMessage{ClusterID: s.clusterID}
	s.eachServedRing(false, func(k ringID, a *ring.Allocator) {
		m.Rings = append(m.Rings, ipamwire.RingEntry{Overlay: k.overlay, Family: k.family, Ring: a.EncodeRing()})
	})
	return m
}

// Rings returns the encoding of every ring this agent serves, by
// "<overlay>/<family>".
func (s *Service) Rings() map[string][]byte {
	out := map[string][]byte{}
	for _, e := range s.rings().Rings {
		out[e.Overlay+"/"+e.Family] = e.Ring
	}
	return out
}

// eachServedRing calls f for every served ring, in order, after writing
// its free counts into it when syncFree is set; s.mu is held. Free counts
// are written only where they are announced at once (announce): a digest
// of counts no broadcast carried yet would start anti-entropy that races
// the broadcast, and a receiver that got the push first would not relay it.
func (s *Service) eachServedRing(syncFree bool, f func(k ringID, a *ring.Allocator)) {
	for _, name := range sortedKeys(s.overlays) {
		for fam := range families {
			a := s.allocatorOf(name, familyName(fam))
			if a == nil {
				continue
			}
			if syncFree {
				if _, err := a.SyncFree(); err != nil {
					s.log.Warn("ring free counts", "overlay", name, "err", err)
				}
			}
			f(ringID{name, familyName(fam)}, a)
		}
	}
}

// gossipOf returns the gossip state of a served ring; s.mu is held.
func (s *Service) gossipOf(k ringID, a *ring.Allocator) *ringGossip {
	g := s.gossipState[k]
	if g == nil {
		g = &ringGossip{}
		s.gossipState[k] = g
	}
	if u := a.Ring().Universe(); g.known == nil || g.known.Universe() != u {
		g.known, _ = ring.NewRing(u) // the allocator's universe: valid
		g.changes, g.buckets = 0, nil
	}
	return g
}

// markKnown applies to an overlay family's known ring what every agent
// derives alike (the masters' leases), or what it already holds (a ring
// read back from disk), so that it is never broadcast; s.mu is held.
func (s *Service) markKnown(o *overlay, fam int, f func(known *ring.Ring) error) {
	a := o.alloc[fam]
	if a == nil {
		return
	}
	if g := s.gossipOf(ringID{o.name, familyName(fam)}, a); g.known != nil {
		if err := f(g.known); err != nil {
			s.log.Debug("known ring", "overlay", o.name, "family", familyName(fam), "err", err)
		}
	}
}

// forgetGossip drops the gossip state of an overlay's rings (retired: its
// next rings start over); s.mu is held.
func (s *Service) forgetGossip(overlay string) {
	for fam := range families {
		delete(s.gossipState, ringID{overlay, familyName(fam)})
	}
}

// announce broadcasts, of every served ring, the entries the other agents
// do not hold yet: what this agent wrote since its last announcement (a
// grant, a return, free counts). Nothing, when nothing changed.
func (s *Service) announce() {
	s.mu.Lock()
	m := ipamwire.RingMessage{ClusterID: s.clusterID}
	s.eachServedRing(true, func(k ringID, a *ring.Allocator) {
		g := s.gossipOf(k, a)
		if g.announced == a.RingChanges() {
			return
		}
		g.announced = a.RingChanges()
		if d, ok := a.Ring().Delta(g.known); ok {
			m.Rings = append(m.Rings, ipamwire.RingEntry{Overlay: k.overlay, Family: k.family, Ring: d.Claims().Encode()})
			if _, err := g.known.Merge(d); err != nil {
				s.log.Debug("known ring", "overlay", k.overlay, "family", k.family, "err", err)
			}
		}
	})
	s.mu.Unlock()
	s.broadcast(m)
}

// kickAnnounce asks Run to announce (from gossip callbacks, which must not
// broadcast themselves).
func (s *Service) kickAnnounce() {
	select {
	case s.announceKick <- struct{}{}:
	default:
	}
}

// mergeRings merges remote rings (or parts), makes the changed ones
// durable, and returns what was news (to relay): the deltas of the changed
// rings. A remote change that would take a range holding allocations is
// refused by the allocator (ring.TakeoverError) and the ring stays as it
// was; so does a message of another cluster (errOtherCluster).
func (s *Service) mergeRings(m ipamwire.RingMessage) (ipamwire.RingMessage, error) {
	news, b, err := s.decideMerge(m)
	if b != nil {
		if ferr := s.flush(b); ferr != nil {
			err = errors.Join(err, fmt.Errorf("persist rings: %w", ferr))
		}
	}
	if len(news.Rings) > 0 {
		s.changed()
	}
	return news, err
}

// persistDirtyRings writes the rings that changed by other agents'
// entries only since they were last written (Run, every ringPersistEvery).
func (s *Service) persistDirtyRings() {
	s.mu.Lock()
	var b *batch
	for _, k := range slices.SortedFunc(maps.Keys(s.dirtyRings), func(x, y ringID) int {
		return cmp.Or(cmp.Compare(x.overlay, y.overlay), cmp.Compare(x.family, y.family))
	}) {
		delete(s.dirtyRings, k)
		if a := s.allocatorOf(k.overlay, k.family); a != nil {
			b = s.enqueue(change{writes: []write{putRing(k.overlay, familyIndex(k.family), a.EncodeRing())}})
		}
	}
	s.mu.Unlock()
	if b != nil {
		if err := s.flush(b); err != nil {
			s.log.Warn("persist rings", "err", err)
		}
	}
}

func (s *Service) decideMerge(m ipamwire.RingMessage) (ipamwire.RingMessage, *batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	news := ipamwire.RingMessage{ClusterID: s.clusterID}
	if s.clusterID != "" && m.ClusterID != "" && m.ClusterID != s.clusterID {
		return news, nil, fmt.Errorf("%w: %q, this agent's is %q", errOtherCluster, m.ClusterID, s.clusterID)
	}
	var b *batch
	var errs []error
	for _, e := range m.Rings {
		a := s.allocatorOf(e.Overlay, e.Family)
		if a == nil {
			continue // an overlay this agent does not serve (yet)
		}
		remote, err := ring.Decode(e.Ring)
		if err != nil {
			errs = append(errs, fmt.Errorf("ring %s/%s: %w", e.Overlay, e.Family, err))
			continue
		}
		// Only attributed claims join: the claims the writer signed
		// where it leases, never a lease (claims.go).
		remote = s.admit(a, e, remote)
		before, ownedBefore := a.Ring(), a.Owned()
		changed, err := a.Merge(remote)
		if err != nil {
			var te *ring.TakeoverError
			if errors.As(err, &te) {
				s.log.Warn("refused a ring change that takes addresses in use", "overlay", e.Overlay, "family", e.Family, "err", err)
			}
			errs = append(errs, fmt.Errorf("ring %s/%s: %w", e.Overlay, e.Family, err))
			continue
		}
		g := s.gossipOf(ringID{e.Overlay, e.Family}, a)
		if _, err := g.known.Merge(remote); err != nil {
			s.log.Debug("known ring", "overlay", e.Overlay, "family", e.Family, "err", err)
		}
		if !changed && len(s.expectedGrants[e.Overlay]) == 0 {
			// (An expected grant whose ring came by gossip first is
			// adopted now, from the answer: mayAdopt.)
			continue
		}
		fam := familyIndex(e.Family)
		o := s.overlays[e.Overlay]
		writes, adopted := o.syncBlocks(s.overlaySync(o.name), fam)
		k := ringID{e.Overlay, e.Family}
		if len(writes) > 0 || adopted || !slices.Equal(ownedBefore, a.Owned()) {
			// What this agent owns moved: durable before anything is
			// allocated from it.
			delete(s.dirtyRings, k)
			b = s.enqueue(change{writes: append([]write{putRing(e.Overlay, fam, a.EncodeRing())}, writes...)})
		} else {
			// Other agents' entries only (free counts, their grants): a
			// crash loses nothing anti-entropy does not bring back, and
			// writing the whole ring per change would cost every agent
			// the cluster's size on disk for each change anywhere.
			s.dirtyRings[k] = true
		}
		if adopted {
			// A grant, or one this agent held before it lost its data dir:
			// take back the addresses its containers hold there first.
			s.claimPersisted(o, slog.LevelDebug)
			s.reclaimFromCNICache(o, func(c change) { b = s.enqueue(c) })
		}
		if d, ok := a.Ring().Delta(before); ok {
			news.Rings = append(news.Rings, ipamwire.RingEntry{Overlay: e.Overlay, Family: e.Family, Ring: d.Claims().Encode()})
		}
	}
	return news, b, errors.Join(errs...)
}

// broadcast sends changed rings on the ring channel.
func (s *Service) broadcast(m ipamwire.RingMessage) {
	if len(m.Rings) == 0 {
		return
	}
	s.mu.Lock()
	ch := s.channel
	s.mu.Unlock()
	if ch != nil {
		ch.Broadcast(ringData{msg: m, sent: s.onSent})
	}
}

// unicast sends a ring message to one peer.
func (s *Service) unicast(dst, kind string, m ipamwire.RingMessage) {
	s.mu.Lock()
	ch := s.channel
	s.mu.Unlock()
	if ch == nil {
		return
	}
	b := ipamwire.EncodeRingMessage(m)
	if err := ch.Unicast(dst, b); err != nil {
		s.log.Debug("ring anti-entropy unicast", "to", dst, "err", err)
		return
	}
	if s.onSent != nil {
		s.onSent(kind, len(b))
	}
}

// RingGossip is the handler of RingChannel.
func (s *Service) RingGossip() gossip.Handler { return (*ringHandler)(s) }

// ringHandler receives ring gossip.
type ringHandler Service

// Gossip implements gossip.Handler: the digest of the served rings. It
// also has Run announce what this agent wrote since its last announcement
// (free counts are written into the rings then, not on every allocation).
func (h *ringHandler) Gossip() gossip.Data {
	s := (*Service)(h)
	s.mu.Lock()
	d := s.ringDigestLocked()
	cluster := s.clusterID // sync changes it
	s.mu.Unlock()
	s.kickAnnounce()
	if len(d) == 0 {
		return nil
	}
	return ringData{msg: ipamwire.RingMessage{ClusterID: cluster, From: s.id, Digest: d}, sent: s.onSent}
}

// receive handles a ring message; src is the sender of a unicast ("" for
// broadcast and gossip).
func (h *ringHandler) receive(src string, msg []byte) (gossip.Data, error) {
	s := (*Service)(h)
	m, err := ipamwire.DecodeRingMessage(msg)
	if err != nil {
		s.metrics.ringGossip.WithLabelValues(gossipBad).Inc()
		return nil, err
	}
	s.mu.Lock()
	other := s.clusterID != "" && m.ClusterID != "" && m.ClusterID != s.clusterID
	s.mu.Unlock()
	if other {
		s.metrics.ringGossip.WithLabelValues(gossipOtherCluster).Inc()
		return nil, fmt.Errorf("%w: %q", errOtherCluster, m.ClusterID)
	}
	if m.Digest != nil && m.From != s.id {
		if ans := s.answerDigest(m); len(ans.Buckets) > 0 {
			s.unicast(m.From, "buckets", ans)
		}
	}
	if len(m.Buckets) > 0 && src != "" {
		if push := s.answerBuckets(m); len(push.Rings) > 0 {
			s.unicast(src, "push", push)
		}
	}
	if len(m.Rings) == 0 {
		return nil, nil
	}
	news, err := s.mergeRings(m)
	switch {
	case errors.Is(err, errOtherCluster):
		s.metrics.ringGossip.WithLabelValues(gossipOtherCluster).Inc()
	case err != nil:
		s.metrics.ringGossip.WithLabelValues(gossipRefused).Inc()
	}
	if src != "" && err == nil {
		if back := s.pushBack(m); len(back.Rings) > 0 {
			s.unicast(src, "push", back)
		}
	}
	if len(news.Rings) == 0 {
		if err == nil {
			s.metrics.ringGossip.WithLabelValues(gossipKnown).Inc()
		}
		return nil, err
	}
	s.metrics.ringGossip.WithLabelValues(gossipNews).Inc()
	if src != "" {
		return nil, err // merged, not relayed: each agent runs its own anti-entropy
	}
	return ringData{msg: news, sent: s.onSent}, err
}

// OnGossip implements gossip.Handler.
func (h *ringHandler) OnGossip(msg []byte) (gossip.Data, error) { return h.receive("", msg) }

// OnBroadcast implements gossip.Handler.
func (h *ringHandler) OnBroadcast(_ string, msg []byte) (gossip.Data, error) {
	return h.receive("", msg)
}

// OnUnicast implements gossip.Handler. Two kinds of message travel by
// unicast on the ring channel: space requests and their answers (growth),
// which always carry a "kind", and anti-entropy messages (bucket hashes,
// pushes), which never do (merged and not relayed).
func (h *ringHandler) OnUnicast(src string, msg []byte) error {
	if ipamwire.IsSpaceMessage(msg) {
		return h.onSpaceMessage(src, msg)
	}
	_, err := h.receive(src, msg)
	return err
}
