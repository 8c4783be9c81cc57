package ipam

// The IPAM's side of its ring gossip (package ringgossip): the served
// rings it lends the gossip under s.mu, and the merge of what the gossip
// receives into them.

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/agent/ipam/ringgossip"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// ringID names a ring: an overlay and a family ("4", "6").
type ringID struct{ overlay, family string }

// gossipID is the ring's name for package ringgossip.
func (k ringID) gossipID() ringgossip.ID { return ringgossip.ID{Overlay: k.overlay, Family: k.family} }

// ringPersistEvery is how often rings changed by other agents' entries
// only are written to disk.
const ringPersistEvery = 10 * time.Second

// allocatorOf returns a served overlay's allocator of a family ("4", "6");
// the caller holds s.mu.
func (s *Service) allocatorOf(overlay, family string) *ring.Allocator {
	o := s.overlays[overlay]
	if o == nil || o.Unserved != "" {
		return nil
	}
	if family == "6" {
		return o.Alloc[1]
	}
	return o.Alloc[0]
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
// its free counts into it when syncFree is set (ringgossip.Served.Each);
// s.mu is held.
func (s *Service) eachServedRing(syncFree bool, f func(k ringID, a *ring.Allocator)) {
	for _, name := range sortedKeys(s.overlays) {
		for fam := range families {
			a := s.allocatorOf(name, ipfamily.Name(fam))
			if a == nil {
				continue
			}
			if syncFree {
				if _, err := a.SyncFree(); err != nil {
					s.log.Warn("ring free counts", "overlay", name, "err", err)
				}
			}
			f(ringID{name, ipfamily.Name(fam)}, a)
		}
	}
}

// markKnown applies to an overlay family's known ring what every agent
// derives alike (the masters' leases), or what it already holds (a ring
// read back from disk), so that it is never broadcast; s.mu is held.
func (s *Service) markKnown(o *overlay, fam int, f func(known *ring.Ring) error) {
	if a := o.Alloc[fam]; a != nil {
		s.gossip.Known(ringID{o.Name, ipfamily.Name(fam)}.gossipID(), a, f)
	}
}

// mergeRings merges remote rings (or parts), makes the changed ones
// durable, and returns what was news (to relay): the deltas of the changed
// rings. A remote change that would take a range holding allocations is
// refused by the allocator (ring.TakeoverError) and the ring stays as it
// was; so does a message of another cluster (ringgossip.ErrOtherCluster).
func (s *Service) mergeRings(m ipamwire.RingMessage) (ipamwire.RingMessage, error) {
	news, b, err := s.decideMerge(m)
	if b != nil {
		if ferr := s.commits.Flush(b); ferr != nil {
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
			b = s.commits.Enqueue(change{Writes: []write{putRing(k.overlay, ipfamily.Index(k.family), a.EncodeRing())}})
		}
	}
	s.mu.Unlock()
	if b != nil {
		if err := s.commits.Flush(b); err != nil {
			s.log.Warn("persist rings", "err", err)
		}
	}
}

func (s *Service) decideMerge(m ipamwire.RingMessage) (ipamwire.RingMessage, *batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	news := ipamwire.RingMessage{ClusterID: s.clusterID}
	if s.clusterID != "" && m.ClusterID != "" && m.ClusterID != s.clusterID {
		return news, nil, fmt.Errorf("%w: %q, this agent's is %q", ringgossip.ErrOtherCluster, m.ClusterID, s.clusterID)
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
		k := ringID{e.Overlay, e.Family}
		s.gossip.Known(k.gossipID(), a, func(known *ring.Ring) error { _, err := known.Merge(remote); return err })
		if !changed && len(s.expectedGrants[e.Overlay]) == 0 {
			// (An expected grant whose ring came by gossip first is
			// adopted now, from the answer: mayAdopt.)
			continue
		}
		fam := ipfamily.Index(e.Family)
		o := s.overlays[e.Overlay]
		writes, adopted := o.SyncBlocks(s.overlaySync(o.Name), fam)
		if len(writes) > 0 || adopted || !slices.Equal(ownedBefore, a.Owned()) {
			// What this agent owns moved: durable before anything is
			// allocated from it.
			delete(s.dirtyRings, k)
			b = s.commits.Enqueue(change{Writes: append([]write{putRing(e.Overlay, fam, a.EncodeRing())}, writes...)})
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
			s.reclaimFromCNICache(o, func(c change) { b = s.commits.Enqueue(c) })
		}
		if d, ok := a.Ring().Delta(before); ok {
			news.Rings = append(news.Rings, ipamwire.RingEntry{Overlay: e.Overlay, Family: e.Family, Ring: d.Claims().Encode()})
		}
	}
	return news, b, errors.Join(errs...)
}

// RingGossip is the handler of RingChannel.
func (s *Service) RingGossip() gossip.Handler { return s.gossip.Handler() }

// ringOwner is the Service as the owner of the rings its gossip gossips
// (ringgossip.Rings).
type ringOwner Service

func (r *ringOwner) Read(f func(ringgossip.Served)) {
	s := (*Service)(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	f((*servedRings)(s))
}

func (r *ringOwner) Merge(m ipamwire.RingMessage) (ipamwire.RingMessage, error) {
	return (*Service)(r).mergeRings(m)
}

func (r *ringOwner) Channel() gossip.Channel {
	s := (*Service)(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.channel
}

func (r *ringOwner) OnSpace(src string, msg []byte) error {
	return (*Service)(r).onSpaceMessage(src, msg)
}

// servedRings are the served rings under s.mu (ringgossip.Served).
type servedRings Service

func (sv *servedRings) ClusterID() string { return sv.clusterID }

func (sv *servedRings) Allocator(id ringgossip.ID) *ring.Allocator {
	return (*Service)(sv).allocatorOf(id.Overlay, id.Family)
}

func (sv *servedRings) Each(syncFree bool, f func(ringgossip.ID, *ring.Allocator)) {
	(*Service)(sv).eachServedRing(syncFree, func(k ringID, a *ring.Allocator) { f(k.gossipID(), a) })
}
